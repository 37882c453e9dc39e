"""Opt-in probes that investigate this host rather than calibrate it (docs/hil.md "Host drift", "Scheduler trace").

Nothing here feeds the device profile or the host runtime model: those come only from the calibration steps
`experiments.calibrate` runs (`hil.calibrate`, `hil.host`). `drift`: probes of the host's kernels, reads, first touch
and wake-up placement that `experiments.validate diagnostics=true` runs around its cold runs, compared with the
reference probe the calibration stores with the profile (`measurements.json`, `host_probe`); `schedtrace`: one more
cold run with the kernel's scheduler events traced (`experiments.validate sched_trace=true`); `mnn_overlap`: whether
MNN's cold load hides the weight file's read behind its set-up (`python -m hil.diagnostics.mnn_overlap`).
"""
