"""Measuring the decoders and the models on a device, without the command line (``wam-diff2 bench``,
``bench --data``, ``verify-device``); README.md says what each module measures.

    wam-diff2 verify-device --device cpu --shape tiny
"""
