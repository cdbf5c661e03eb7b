"""The end-to-end state and one processor step from it: what training, evaluation and every forecast share.

Units: the state is normalised per channel by the store statistics (`WindowSpec.in_mean/in_std`), the
processor predicts the normalised tendency (`out_mean/out_std`). With z the normalised state and p the
processor output,

    z(t+1) = z(t) + (p * out_std + out_mean) / in_std                 (residual processor)
    z(t+1) = (p * out_std + out_mean - in_mean) / in_std               (a processor that predicts the state)

and `physical(z) = z * in_std + in_mean` on the kept grid.
"""

from __future__ import annotations

import torch

from wxray.data.windows import WindowSpec, per_channel


def obs_of(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k.startswith("obs.")}


def processor_input(z: torch.Tensor, x: torch.Tensor, n_state: int) -> torch.Tensor:
    """The processor's input for state `z`: z then the constant fields of the row's input `x`."""
    return torch.cat([z, x[:, n_state:]], dim=1)


def next_state(spec: WindowSpec, z: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """Normalised state after one processor step from normalised state `z` (see the module docstring)."""
    base = spec.target_in_input
    phys = pred * per_channel(spec.out_std, pred) + per_channel(spec.out_mean, pred)
    in_std, in_mean = per_channel(spec.in_std[base], pred), per_channel(spec.in_mean[base], pred)
    if spec.residual:
        return z[:, base] + phys / in_std
    return (phys - in_mean) / in_std


def physical(spec: WindowSpec, z: torch.Tensor) -> torch.Tensor:
    """Normalised state (b, V, model grid) -> physical units on the kept grid."""
    std = torch.as_tensor(spec.in_std)[None, :, None, None]
    mean = torch.as_tensor(spec.in_mean)[None, :, None, None]
    return spec.unpad(z.float() * std + mean)
