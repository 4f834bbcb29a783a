"""Training: AR pretraining, progressive block adaptation, block- and model-wise distillation.

The pipeline reads top to bottom (algorithm spec, sections 4 and 5):

    config.py         the settings and their defaults (the paper's), YAML + --section.key overrides
    data.py           samples (authors' format) -> tokenised examples -> a deterministic stream
    noise.py          stratified noise, prefix || clean || noisy, block-causal mask, labels, positions
    losses.py         1/t-weighted CE, JSD / KL distillation, top-K overlap; chunked over positions
    optim.py          AdamW parameter groups, warm-up + cosine schedule
    checkpointing.py  atomic Hugging Face checkpoints, metrics.jsonl
    trainer_state.py  the resume state (optimizer, scheduler, RNG) in safetensors + JSON, no pickles
    recipes/          finetune (one block size; B = 1 is AR) and distill; curriculum chaining
    evaluate.py       fixed-noise validation loss (compare checkpoints)
    tiny_data.py      a tiny data set in the authors' format (tests, smoke runs)

    wam-diff2 train --config training/curriculum.yaml --data.train_file train.json
"""
