"""Looking inside a trained model: attention maps and their entropies, head importance and pruning, the
attention explorer page, alignment quality on a task with known alignments; and the studies over runs: Table 3's
summary with paired significance tests (ablation), its plan (table3), the Multi30k reproduction (reproduce), whose
command lines are transformer_nmt.summarize_ablation, table3.py, reproduce_multi30k.py and alignment_aer.py."""
