"""``python -m transformer_nmt.alignment_aer``: alignment quality where the truth is known (a tiny Transformer learns
a fixed reordering; each decoder layer's hard alignments scored with AER; a few seconds on one core), printed as a
markdown table (transformer_nmt.analysis.alignment_aer)."""

from __future__ import annotations

from transformer_nmt.analysis.alignment_aer import main

if __name__ == "__main__":
    main()
