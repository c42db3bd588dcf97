"""Export a checkpoint to a CTranslate2 model directory (inference/export.py: ``python -m transformer_nmt.export
ckpt=PATH output=DIR``) or, with ``format=marian``, to a transformers MarianMT directory (interchange/marian.py).

The command reads the options (``ExportOptions``; ``--help`` lists them and their defaults) and hands the
checkpoint to the format's exporter; each exporter refuses, naming the option, a model part that has no form in
its format (model/export_forms.py).
"""

from __future__ import annotations

from pathlib import Path

from transformer_nmt.inference import export as ctranslate2_export
from transformer_nmt.inference.export import ExportOptions
from transformer_nmt.options import command_argv, parse_options, require_checkpoint

OPTIONS = ExportOptions
USAGE = "python -m transformer_nmt.export ckpt=PATH output=DIR [quantization=int8] [format=marian] [force=true]"


def main(argv: list[str] | None = None) -> Path:
    options = parse_options(command_argv(argv), ExportOptions, __doc__, USAGE)
    require_checkpoint(options)
    if not options.output:
        raise SystemExit("missing output=DIR (the model directory to write)")
    if options.format == "marian":
        if options.quantization != "none":
            raise SystemExit("quantization= is an option of format=ctranslate2 (format=marian writes float32)")
        from transformer_nmt.checkpoint import load_checkpoint
        from transformer_nmt.interchange.marian import ConversionError, export_marian  # imports transformers

        model, tokenizer, meta = load_checkpoint(options.ckpt)
        command = "python -m transformer_nmt.export " + " ".join(command_argv(argv))
        try:
            output = export_marian(model, tokenizer, options.output, meta, options.force, command)
        except ConversionError as error:
            raise SystemExit(f"cannot export {options.ckpt} to MarianMT exactly: {error}") from None
        print(f"exported {options.ckpt} -> {output} (MarianMT)")
        return output
    if options.format != "ctranslate2":
        raise SystemExit(f"format={options.format!r}: use ctranslate2 or marian")
    return ctranslate2_export.export_command(options)


if __name__ == "__main__":
    main()
