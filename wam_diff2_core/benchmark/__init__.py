"""Measuring the decoders and the models on a device, without the command line.

- :mod:`.variants`          the decoders compared, by variant name; random benchmark prompts;
- :mod:`.timing`            ms of one forward beside its memory-bandwidth floor, ms per token, whole decodes
                            (``wam-diff2 bench``);
- :mod:`.token_check`       every fast variant's tokens against the plain decoder's;
- :mod:`.device_probe`      what the fast path relies on, checked before anything is timed;
- :mod:`.device_timing`     the graphed forward against its eager twin, the decode at each mask-check
                            interval, a camera frame through ``DrivingPolicy``, quantized weights
                            (the last four: ``wam-diff2 verify-device``);
- :mod:`.model_comparison`  AR against block diffusion on planning and grounding samples
                            (``wam-diff2 bench --data``).

    wam-diff2 verify-device --device cpu --shape tiny
"""
