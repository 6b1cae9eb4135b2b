"""Evaluation and reports: pass@k (`passk`), decontamination (`decontam`), result files (`results`),
the `posttrain eval` runner (`runner`) and the HTML report (`report`)."""
