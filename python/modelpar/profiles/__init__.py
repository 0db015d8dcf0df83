"""Machine profiles the planners cost plans on: calibrated once per machine
(:mod:`~modelpar.profiles.calibration`) for CPU workers
(:mod:`~modelpar.profiles.cpu`) and GPUs (:mod:`~modelpar.profiles.cuda`),
cached on disk (:mod:`~modelpar.profiles.cache`)."""
