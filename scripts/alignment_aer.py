"""Alignment quality where the truth is known (transformer_nmt.analysis.alignment_aer): a tiny Transformer learns
a fixed reordering, and each decoder layer's hard alignments are scored with AER. A few seconds on one CPU core:

    python scripts/alignment_aer.py            # prints the markdown table of AER per layer and position
"""

from transformer_nmt.analysis.alignment_aer import main

if __name__ == "__main__":
    main()
