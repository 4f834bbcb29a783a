"""Training: AR pretraining, progressive block adaptation, block- and model-wise distillation.

The modules in pipeline order: README.md beside this file; the objective and the optimizer they
implement: training/README.md, The objective.

    wam-diff2 train --config training/curriculum.yaml --data.train_file train.json
"""
