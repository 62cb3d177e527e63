"""Training, `tfm train`'s library: one module per idea, `trainer.py` being the loop itself.

objective.py    the label-smoothed loss (section 5.4), with guided alignment if asked
lr_schedules.py the learning-rate schedules (section 5.3, budgeted), a class per kind
step.py         one optimizer update: accumulation, clipping, inf/nan skipping, precision
validation.py   validation loss and BLEU, decoded exactly as `tfm translate` decodes
events.py       what the loop reports to its caller (the CLI renders them)
log_window.py   the running sums of one log interval (losses of applied updates, tokens/s)
state.py        the exact-resume state: counters, optimizer moments, RNG states (never pickled)
run_dir.py      the run directory: file names, checkpoint naming, checks, metrics.jsonl
initialization.py  --init: a run from a checkpoint's weights, model config and tokenizers; recipe checks
preparation.py  run folder checks, text, tokenizers and the tokenized cache, rank 0 first
trainer.py      the Trainer loop and run_training, the entry point

Library code: it never prints. Progress goes to an `on_event` callback and to metrics.jsonl in the
run directory; stopping early is asked for through a `should_stop` callback (the CLI's signal handler).
"""
