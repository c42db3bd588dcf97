// The attention explorer's page: reads the data that explore.py embeds in <script id="explorer-data">,
// draws the head view (query tokens left, key tokens right, one line per weight, heads as colours), the
// matrix of the chosen head and the model view (every layer x head), and exposes window.explorer.
// No library, no network: plain DOM and SVG.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("explorer-data").textContent);
  const decoded = {};  // "sentence/kind" -> Uint8Array, (layers, heads, queries, keys) row-major
  const state = {sentence: 0, kind: data.kinds[0], layer: 0, head: 0, focus: null, pinned: false};

  function weights(sentence, kind) {
    const key = sentence + "/" + kind;
    if (!decoded[key]) {
      const text = atob(data.sentences[sentence].attention[kind].data);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      decoded[key] = bytes;
    }
    return decoded[key];
  }

  function shape(sentence, kind) { return data.sentences[sentence].attention[kind].shape; }  // [L, h, Q, K]

  // Weight of (layer, head, query, key) of the current sentence and kind, in [0, 1] (uint8 / 255).
  function weight(layer, head, q, k) {
    const [, H, Q, K] = shape(state.sentence, state.kind);
    return weights(state.sentence, state.kind)[((layer * H + head) * Q + q) * K + k] / data.scale;
  }

  function tokens() {
    const s = data.sentences[state.sentence];
    return state.kind === "encoder" ? [s.source_tokens, s.source_tokens]
      : state.kind === "decoder" ? [s.target_tokens, s.target_tokens] : [s.target_tokens, s.source_tokens];
  }

  function headColour(head, alpha) {
    const H = shape(state.sentence, state.kind)[1];
    return "hsla(" + Math.round(360 * head / H) + ", 75%, 42%, " + alpha + ")";
  }

  function shownHeads() {
    const H = shape(state.sentence, state.kind)[1];
    return state.head === "all" ? [...Array(H).keys()] : [state.head];
  }

  function gated(kind, layer, head) { return data.gates[kind][layer][head] === 0; }

  function pruned(kind, layer, head) { return gated(kind, layer, head) ? " pruned" : ""; }

  // A highlighted line or cell as numbers: {head, q, k, w}.
  function link(node) {
    const d = node.dataset;
    return {head: Number(d.head), q: Number(d.q), k: Number(d.k), w: Number(d.w)};
  }

  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // --- controls -------------------------------------------------------------------------------
  function fillSelect(id, options, value) {
    const select = document.getElementById(id);
    select.replaceChildren(...options.map(([v, label]) => {
      const option = el("option", {value: String(v)}, label);
      option.selected = String(v) === String(value);
      return option;
    }));
  }

  function renderControls() {
    const [L, H] = shape(state.sentence, state.kind);
    fillSelect("sentence", data.sentences.map((s, i) => [i, (i + 1) + ". " + s.source]), state.sentence);
    fillSelect("kind", data.kinds.map(k => [k, data.kind_names[k]]), state.kind);
    fillSelect("layer", [...Array(L).keys()].map(l => [l, "layer " + l]), state.layer);
    const entropy = data.sentences[state.sentence].entropy[state.kind][state.layer];
    fillSelect("head", [["all", "all heads"]].concat([...Array(H).keys()].map(h =>
      [h, "head " + h + " (entropy " + entropy[h].toFixed(2) + ")" + pruned(state.kind, state.layer, h)])),
      state.head);
  }

  // --- head view: lines between query and key tokens --------------------------------------------
  const ROW = 22, TEXT = 150, GAP = 180;

  function renderHeadView() {
    const [queries, keys] = tokens();
    const svg = el("svg:svg", {width: 2 * TEXT + GAP, height: ROW * (Math.max(queries.length, keys.length) + 1),
                              id: "head-svg"});
    const lines = el("svg:g", {class: "lines"});
    svg.appendChild(lines);
    for (const head of shownHeads()) {
      for (let q = 0; q < queries.length; q++) {
        for (let k = 0; k < keys.length; k++) {
          const w = weight(state.layer, head, q, k);
          if (w === 0) continue;
          lines.appendChild(el("svg:line", {
            x1: TEXT + 4, y1: ROW * (q + 1) - 5, x2: TEXT + GAP - 4, y2: ROW * (k + 1) - 5,
            stroke: headColour(head, 1), "stroke-width": 2, class: "link",
            "data-head": head, "data-q": q, "data-k": k, "data-w": w.toFixed(4)}));
        }
      }
    }
    const side = (list, name, x, anchor) => list.forEach((token, i) => {
      const text = el("svg:text", {x: x, y: ROW * (i + 1), "text-anchor": anchor, class: "token " + name,
                                  "data-side": name, "data-index": i}, token);
      text.addEventListener("mouseenter", () => { if (!state.pinned) setFocus(name, i, false); });
      text.addEventListener("mouseleave", () => { if (!state.pinned) setFocus(null); });
      text.addEventListener("click", () => {
        const same = state.pinned && state.focus && state.focus.side === name && state.focus.index === i;
        setFocus(same ? null : name, i, !same);
      });
      svg.appendChild(text);
    });
    side(queries, "query", TEXT, "end");
    side(keys, "key", TEXT + GAP, "start");
    document.getElementById("head-view").replaceChildren(legend(), svg);
  }

  // One coloured swatch per shown head (a click shows that head alone).
  function legend() {
    const box = el("div", {class: "legend"});
    for (const head of shownHeads()) {
      const item = el("span", {class: "legend-item" + pruned(state.kind, state.layer, head), "data-head": head});
      const swatch = el("span", {class: "swatch"});
      swatch.style.background = headColour(head, 1);
      item.append(swatch, "head " + head + pruned(state.kind, state.layer, head));
      item.addEventListener("click", () => select({head: head}));
      box.appendChild(item);
    }
    return box;
  }

  function isFocused(q, k) {
    return Boolean(state.focus) && ((state.focus.side === "query" && state.focus.index === q) ||
                                    (state.focus.side === "key" && state.focus.index === k));
  }

  // Show the focus without rebuilding anything: with a focused token only its lines stay, the tokens on the
  // other side darken with their weight, and its matrix row or column is outlined.
  function highlight() {
    for (const line of document.querySelectorAll("#head-view line")) {
      const focused = isFocused(Number(line.dataset.q), Number(line.dataset.k));
      line.classList.toggle("hl", focused);
      line.setAttribute("stroke-opacity", state.focus && !focused ? 0 : line.dataset.w);
    }
    for (const text of document.querySelectorAll("#head-view text")) {
      const strength = tokenStrength(text.dataset.side, Number(text.dataset.index));
      text.classList.toggle("focused", Boolean(state.focus) && state.focus.side === text.dataset.side &&
                                       state.focus.index === Number(text.dataset.index));
      if (strength === null) {
        delete text.dataset.w;
        text.style.fill = "";
      } else {
        text.dataset.w = strength.toFixed(4);
        text.style.fill = "rgba(0,0,0," + (0.25 + 0.75 * strength).toFixed(3) + ")";
      }
    }
    for (const cell of document.querySelectorAll("#matrix td")) {
      const focused = isFocused(Number(cell.dataset.q), Number(cell.dataset.k));
      cell.classList.toggle("hl", focused && Number(cell.dataset.w) > 0);
    }
  }

  // With a focused token: how strongly a token on the other side is linked to it (max over shown heads).
  function tokenStrength(side, index) {
    if (!state.focus || state.focus.side === side) return null;
    let best = 0;
    for (const head of shownHeads()) {
      const w = side === "key" ? weight(state.layer, head, state.focus.index, index)
                               : weight(state.layer, head, index, state.focus.index);
      best = Math.max(best, w);
    }
    return best;
  }

  // --- matrix of one head (or, with all heads, each cell coloured by its strongest head) ----------
  function renderMatrix() {
    const [queries, keys] = tokens();
    const table = el("table", {class: "matrix"});
    const header = el("tr");
    header.appendChild(el("th"));
    keys.forEach((token, k) => header.appendChild(el("th", {class: "col", "data-k": k}, token)));
    table.appendChild(header);
    queries.forEach((token, q) => {
      const row = el("tr");
      const label = el("th", {class: "row", "data-q": q}, token);
      label.addEventListener("click", () => setFocus("query", q, true));
      row.appendChild(label);
      keys.forEach((_, k) => {
        let head = shownHeads()[0], w = -1;
        for (const h of shownHeads()) {
          const v = weight(state.layer, h, q, k);
          if (v > w) { w = v; head = h; }
        }
        const cell = el("td", {class: "cell", "data-q": q, "data-k": k,
                               "data-head": head, "data-w": w.toFixed(4),
                               title: queries[q] + " -> " + keys[k] + ": " + w.toFixed(3) + " (head " + head + ")"});
        cell.style.background = headColour(head, w.toFixed(3));
        row.appendChild(cell);
      });
      table.appendChild(row);
    });
    document.getElementById("matrix").replaceChildren(table);
  }

  // --- model view: every layer x head of the current kind ------------------------------------------
  function renderGrid() {
    const [L, H, Q, K] = shape(state.sentence, state.kind);
    const cell = Math.max(2, Math.min(6, Math.floor(90 / Math.max(Q, K))));
    const grid = el("div", {class: "grid"});
    grid.style.gridTemplateColumns = "auto repeat(" + H + ", auto)";
    grid.appendChild(el("div"));
    for (let h = 0; h < H; h++) grid.appendChild(el("div", {class: "grid-label"}, "head " + h));
    const entropy = data.sentences[state.sentence].entropy[state.kind];
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("div", {class: "grid-label"}, "layer " + l));
      for (let h = 0; h < H; h++) {
        const selected = l === state.layer && (state.head === "all" || state.head === h);
        const box = el("figure", {class: "thumb" + (selected ? " selected" : "") + pruned(state.kind, l, h),
                                  "data-layer": l, "data-head": h, "data-entropy": entropy[l][h].toFixed(3)});
        const canvas = el("canvas", {width: K * cell, height: Q * cell});
        const context = canvas.getContext("2d");
        for (let q = 0; q < Q; q++) {
          for (let k = 0; k < K; k++) {
            context.fillStyle = headColour(h, weight(l, h, q, k).toFixed(3));
            context.fillRect(k * cell, q * cell, cell, cell);
          }
        }
        box.appendChild(canvas);
        box.appendChild(el("figcaption", {}, "H " + entropy[l][h].toFixed(2) + pruned(state.kind, l, h)));
        box.addEventListener("click", () => select({layer: l, head: h}));
        grid.appendChild(box);
      }
    }
    document.getElementById("model-view").replaceChildren(grid);
  }

  function renderCaption() {
    const s = data.sentences[state.sentence];
    document.getElementById("source").textContent = s.source;
    document.getElementById("translation").textContent = s.translation;
    const [queries, keys] = data.axis_names[state.kind];
    document.getElementById("axes").textContent = "left / rows: " + queries + "; right / columns: " + keys +
      (state.head === "all" ? "; each head in its own colour" : "");
  }

  function render() {
    renderControls();
    renderCaption();
    renderHeadView();
    renderMatrix();
    renderGrid();
    highlight();
    document.body.dataset.kind = state.kind;
    document.body.dataset.layer = state.layer;
    document.body.dataset.head = state.head;
  }

  function setFocus(side, index, pinned) {
    state.focus = side ? {side: side, index: index} : null;
    state.pinned = Boolean(side) && Boolean(pinned);
    highlight();
  }

  // Change the sentence, kind, layer or head; what no longer exists falls back to 0 and the focus clears.
  function select(change) {
    Object.assign(state, change);
    state.sentence = Math.min(Number(state.sentence), data.sentences.length - 1);
    const [L, H] = shape(state.sentence, state.kind);
    state.layer = Math.min(Number(state.layer), L - 1);
    state.head = state.head === "all" ? "all" : Math.min(Number(state.head), H - 1);
    state.focus = null;
    state.pinned = false;
    render();
  }

  for (const id of ["sentence", "kind", "layer", "head"]) {
    document.getElementById(id).addEventListener("change", event => {
      const value = event.target.value;
      select({[id]: id === "kind" || value === "all" ? value : Number(value)});
    });
  }

  window.explorer = {
    data: data,
    select: select,
    focus: setFocus,
    weight: weight,
    // The page as a test (or a person at the console) sees it: selection, focus and highlighted lines/cells.
    state: () => ({
      sentence: state.sentence, kind: state.kind, layer: state.layer, head: state.head, focus: state.focus,
      lines: [...document.querySelectorAll("#head-view line.hl")].map(link),
      cells: [...document.querySelectorAll("#matrix td.hl")].map(link),
    }),
  };
  render();
})();
