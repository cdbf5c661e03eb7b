"""EDM samplers (Karras et al. 2022): deterministic Heun (Algorithm 1) and the stochastic sampler (Algorithm 2).

Noise levels, i = 0 .. N-1, and t_N = 0:

    t_i = (sigma_max^(1/rho) + i / (N - 1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho

Step i (Algorithm 2; Algorithm 1 is the case gamma_i = 0):

    gamma_i = min(S_churn / N, sqrt(2) - 1) if S_min <= t_i <= S_max else 0
    t_hat = (1 + gamma_i) t_i;  x_hat = x_i + sqrt(t_hat^2 - t_i^2) S_noise eps,  eps ~ N(0, I)
    d = (x_hat - D(x_hat; t_hat)) / t_hat;  x_{i+1} = x_hat + (t_{i+1} - t_hat) d
    if t_{i+1} != 0:  d' = (x_{i+1} - D(x_{i+1}; t_{i+1})) / t_{i+1};  x_{i+1} = x_hat + (t_{i+1} - t_hat)(d + d') / 2

x_0 = t_0 eps_0. Every draw comes from the explicit `generator` (eps_0, then eps of each churned step in
order; no draw when gamma_i = 0), so a fixed generator state gives a bit-identical sample. The token
routing is drawn once per sample before the first step (model.draw_routing, after eps_0) and held for
all 2N - 1 denoiser calls of that sample's trajectory, unless the caller passes its own `routing`.
With a RowGenerators (one generator per row) row b's sample depends on generator b only, so an ensemble
member can be recomputed alone or in another batch.

`EDMForecaster` wraps a trained denoiser with its sampler settings so that it is called as a
forecaster is, forecaster(x, generator=g) -> one sample per row: rollouts and validation need no
generative special case beyond passing per-row generators.

Discretisation bias of the spread (`spread_gain`): with the exact denoiser of Gaussian data Y ~ N(0, s^2),
D(x; t) = s^2 / (s^2 + t^2) x, every step is linear in x, so the sample's sd / s follows from the schedule
alone. Heun overshoots where t ~ s, most for small s (a sharp conditional distribution, the usual case of a
skilful forecaster: s is the conditional sd in units of the normalised target): at EDM's 18 steps the
spread is 4.5% too wide at s = 1, 9% at s = 0.1, 16% at s = 0.01 (12 steps: 11-43%; the stochastic sampler
with s_churn = 10 at 18 steps: 11-28%). `DEFAULT_STEPS` = 64 keeps it within 1% for s in [0.01, 3] (Heun
-0.8% to +0.6%; with s_churn = 10, -0.3% to +1.4%).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from wxray.models.blocks import RowGenerators, normal
from wxray.models.edm import ResSlimEDM

DEFAULT_STEPS = 64  # noise levels N: the spread's discretisation bias under 1% (module docstring)


def karras_sigmas(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> Tensor:
    """(steps + 1,) float64 noise levels t_0 = sigma_max > ... > t_{N-1} = sigma_min, t_N = 0."""
    if steps < 1 or not 0 < sigma_min <= sigma_max or rho <= 0:
        raise ValueError(f"need steps >= 1, 0 < sigma_min <= sigma_max, rho > 0; got {steps}, {sigma_min}, "
                         f"{sigma_max}, {rho}")
    i = torch.arange(steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    t = (hi + i / max(steps - 1, 1) * (lo - hi)) ** rho
    return torch.cat([t, t.new_zeros(1)])


@torch.no_grad()
def sample_stochastic(
    model: ResSlimEDM,
    cond: Tensor,
    generator: torch.Generator | RowGenerators | None,
    steps: int = DEFAULT_STEPS,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
    s_churn: float = 0.0,
    s_min: float = 0.0,
    s_max: float = math.inf,
    s_noise: float = 1.0,
    routing: Tensor | None = None,
) -> Tensor:
    """EDM Algorithm 2: one sample (B, n_out, h, w) per row of cond (B, C, h, w); see the module doc.

    Call with the model in eval mode (the sampler does not change it). `routing`: a (B, K) selection to
    hold instead of drawing one (e.g. shared by two samplers being compared); None for a dense model.
    Members of an ensemble are rows of the batch (repeat cond): each row gets its own noise and routing.
    """
    B = cond.shape[0]
    device = cond.device
    t = karras_sigmas(steps, sigma_min, sigma_max, rho).tolist()
    x = t[0] * normal((B, model.n_out, *model.img_size), generator, device)
    if routing is None:
        routing = model.draw_routing(B, generator, device)

    def denoise(x_: Tensor, sigma: float) -> Tensor:
        # a tensor, not a float: a compiled denoiser would otherwise recompile for every noise level
        return model(x_, torch.full((), sigma, device=device), cond, generator=generator, routing=routing)

    gamma_max = min(s_churn / steps, math.sqrt(2) - 1)
    for t_cur, t_next in zip(t[:-1], t[1:]):
        gamma = gamma_max if s_min <= t_cur <= s_max else 0.0
        t_hat = t_cur * (1 + gamma)
        x_hat = x
        if gamma > 0:
            x_hat = x + math.sqrt(t_hat**2 - t_cur**2) * s_noise * normal(tuple(x.shape), generator, device)
        d = (x_hat - denoise(x_hat, t_hat)) / t_hat
        x = x_hat + (t_next - t_hat) * d
        if t_next != 0:
            d_next = (x - denoise(x, t_next)) / t_next
            x = x_hat + (t_next - t_hat) * (0.5 * d + 0.5 * d_next)
    return x


def sample_heun(
    model: ResSlimEDM,
    cond: Tensor,
    generator: torch.Generator | RowGenerators | None,
    steps: int = DEFAULT_STEPS,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
    routing: Tensor | None = None,
) -> Tensor:
    """EDM Algorithm 1 (deterministic Heun, 2N - 1 denoiser calls): the generator draws x_0 and the routing only."""
    return sample_stochastic(model, cond, generator, steps, sigma_min, sigma_max, rho, routing=routing)


def spread_gain(sd: float, steps: int = DEFAULT_STEPS, sigma_min: float = 0.002, sigma_max: float = 80.0,
                rho: float = 7.0, s_churn: float = 0.0, s_min: float = 0.0, s_max: float = math.inf,
                s_noise: float = 1.0) -> float:
    """Sample sd / true sd of `sample_stochastic` (Heun when s_churn = 0) with the exact denoiser of Gaussian
    data of sd `sd` (module docstring): 1 is unbiased. Exact, from the variance of x through the linear steps
    (churn adds its noise variance before a step)."""
    t = karras_sigmas(steps, sigma_min, sigma_max, rho).tolist()

    def k(tt: float) -> float:  # (x - D(x; t)) / t = k(t) x for the Gaussian denoiser
        return tt / (sd * sd + tt * tt)

    var = t[0] ** 2
    gamma_max = min(s_churn / steps, math.sqrt(2) - 1)
    for t_cur, t_next in zip(t[:-1], t[1:]):
        gamma = gamma_max if s_min <= t_cur <= s_max else 0.0
        t_hat = t_cur * (1 + gamma)
        var += (t_hat**2 - t_cur**2) * s_noise**2
        h = t_next - t_hat
        gain = 1 + h * k(t_hat)
        if t_next != 0:
            gain = 1 + 0.5 * h * (k(t_hat) + k(t_next) * gain)
        var *= gain**2
    return math.sqrt(var) / sd


SAMPLERS = ("heun", "stochastic")


class EDMForecaster(nn.Module):
    """A denoiser as a forecaster: forward(x, generator=None) -> one sample (B, n_out, h, w) per row of x.

    x is the conditioning (the history frames and constants, laid out as ResSlimViT's input); the sample is
    a draw of the target the denoiser was trained on. sampler="heun" is Algorithm 1 (s_churn etc. unused),
    "stochastic" Algorithm 2. The denoiser is switched to eval mode on every call: a sample never uses
    dropout or drop path. Draws as `sample_stochastic`'s, from `generator` (a RowGenerators for members).
    """

    generative = True

    def __init__(self, denoiser: ResSlimEDM, sampler: str = "heun", steps: int = DEFAULT_STEPS,
                 sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0, s_churn: float = 0.0,
                 s_min: float = 0.0, s_max: float = math.inf, s_noise: float = 1.0):
        super().__init__()
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        karras_sigmas(steps, sigma_min, sigma_max, rho)  # checks the schedule's arguments
        self.denoiser = denoiser
        self.settings = dict(steps=steps, sigma_min=sigma_min, sigma_max=sigma_max, rho=rho)
        if sampler == "stochastic":
            self.settings.update(s_churn=s_churn, s_min=s_min, s_max=s_max, s_noise=s_noise)

    def forward(self, x: Tensor, generator: torch.Generator | RowGenerators | None = None) -> Tensor:
        was_training = self.denoiser.training
        self.denoiser.eval()
        try:
            return sample_stochastic(self.denoiser, x, generator, **self.settings)
        finally:
            self.denoiser.train(was_training)
