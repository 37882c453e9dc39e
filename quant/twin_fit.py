"""Refit the statistical twin (quant.twin) from the real SmolLM2: calibrate S_I on the calibration slice, smooth,
fit, store quant/data/twin_smollm2_135m.json. Deliberate, never implicit: `python -m quant.twin_fit`."""
from __future__ import annotations

import numpy as np

from quant.arch import ModelSpec, smollm2_spec
from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens
from quant.gguf_model import load_weights
from quant.settings import QuantSettings
from quant.twin import regenerate_twin


def calibration_in_max(spec: ModelSpec, weights: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """S_I (max |X| per input channel) of every linear on the quantizer's calibration slice, and its description."""
    q = QuantSettings()
    tokens = eval_text_tokens(spec, q.calib_tokens, q.calib_offset)
    return calibrate(weights, spec, tokens).in_max, (f"S_I = max |X| on {q.calib_tokens} tokens of the evaluation "
                                                      f"text from offset {q.calib_offset}")


def main() -> None:
    spec = smollm2_spec()
    weights = load_weights(spec)
    in_max, how = calibration_in_max(spec, weights)
    print(regenerate_twin(spec, weights, in_max, how))


if __name__ == "__main__":
    main()
