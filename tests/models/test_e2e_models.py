"""ObsEncoder and StationDecoder: shapes, stream denial, key/shape errors, longitude periodicity."""

import pytest
import torch

from wxray.models import ObsEncoder, StationDecoder, StreamInput

H, W = 16, 32
LAT = torch.linspace(-84.375, 84.375, H)
LON = torch.arange(W) * 360.0 / W
SWATH_LAT, SWATH_LON = torch.arange(-87.0, 90.0, 6.0), torch.arange(0.0, 360.0, 6.0)

STREAMS = [
    StreamInput("stations", "points_to_grid", 3),
    StreamInput("ships", "points_to_grid", 2),
    StreamInput("swath", "grid_to_grid", 1, tuple(SWATH_LAT.tolist()), tuple(SWATH_LON.tolist())),
]


def make_obs(b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = {}
    for name, n, c in (("stations", 40, 3), ("ships", 25, 2)):
        coords = torch.stack([torch.rand(b, n, generator=g) * 160 - 80, torch.rand(b, n, generator=g) * 360], -1)
        obs[f"obs.{name}.coords"] = coords
        obs[f"obs.{name}.values"] = torch.randn(b, n, c, generator=g)
        obs[f"obs.{name}.mask"] = (torch.rand(b, n, c, generator=g) > 0.2).float()
        obs[f"obs.{name}.id"] = torch.arange(n).expand(b, n)
    shape = (b, 1, SWATH_LAT.numel(), SWATH_LON.numel())
    obs["obs.swath.values"] = torch.randn(shape, generator=g)
    obs["obs.swath.mask"] = (torch.rand(shape, generator=g) > 0.5).float()
    return obs


def make_encoder(**kw):
    torch.manual_seed(0)
    return ObsEncoder(STREAMS, LAT, LON, n_static=2, n_out=4, hidden=8, embed_dim=32, depth=2, num_heads=4, **kw)


def test_encoder_shapes_and_stream_channels():
    enc = make_encoder()
    assert [enc.stream_channels(s.name) for s in STREAMS] == [slice(0, 6), slice(6, 10), slice(10, 12)]
    obs = make_obs()
    e = enc.embed(obs)
    assert e.shape == (2, 12, H, W) and torch.isfinite(e).all()
    z0 = enc(obs, torch.randn(2, 2, H, W))
    assert z0.shape == (2, 4, H, W)
    z0.square().mean().backward()
    for sc in enc.setconvs:  # every stream's own length scale is trained
        assert sc.log_length_scale.grad is not None and sc.log_length_scale.grad != 0
    # default length scale: the model grid step
    assert enc.setconvs[0].length_scale.item() == pytest.approx((168.75 / 15 + 11.25) / 2, rel=1e-5)


def test_denial_changes_the_embedding_only_in_that_streams_channels():
    enc = make_encoder()
    obs = make_obs()
    full = enc.embed(obs)
    for name in ("stations", "ships", "swath"):
        denied = enc.embed(obs, deny=[name])
        sl = enc.stream_channels(name)
        assert torch.equal(denied[:, sl], torch.zeros_like(denied[:, sl]))
        assert not torch.equal(full[:, sl], denied[:, sl])
        keep = torch.ones(full.shape[1], dtype=torch.bool)
        keep[sl] = False
        assert torch.equal(full[:, keep], denied[:, keep])
    static = torch.randn(2, 2, H, W)
    assert not torch.equal(enc(obs, static), enc(obs, static, deny=["ships"]))


def test_per_sample_keep_mask_denies_streams_sample_by_sample():
    enc = make_encoder()
    obs = make_obs(b=3)
    keep = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    masked = enc.embed(obs, keep=keep)
    assert torch.equal(masked[0], enc.embed(obs)[0])
    assert torch.equal(masked[1], enc.embed(obs, deny=["ships"])[1])
    assert torch.equal(masked[2], enc.embed(obs, deny=["stations", "swath"])[2])
    with pytest.raises(ValueError, match="keep must be"):
        enc.embed(obs, keep=keep[:, :2])


def test_denied_stream_reads_exactly_like_an_empty_one():
    enc = make_encoder()
    obs = make_obs()
    empty = {**obs, "obs.ships.mask": torch.zeros_like(obs["obs.ships.mask"])}
    assert torch.equal(enc.embed(obs, deny=["ships"]), enc.embed(empty))


def test_encoder_without_static_and_non_periodic():
    torch.manual_seed(0)
    enc = ObsEncoder(STREAMS[:1], LAT, LON, 0, 3, hidden=8, embed_dim=32, depth=1, num_heads=2,
                     length_scale_deg=3.0, periodic_longitude=False)
    obs = {k: v for k, v in make_obs(b=1).items() if k.startswith("obs.stations.")}
    assert enc(obs).shape == (1, 3, H, W)
    assert enc.setconvs[0].length_scale.item() == pytest.approx(3.0)
    assert not enc.setconvs[0].periodic


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda o: o.pop("obs.ships.coords"), "obs.ships.coords"),
        (lambda o: o.pop("obs.swath.mask"), "obs.swath.mask"),
        (lambda o: o.__setitem__("obs.radar.values", torch.zeros(2, 1)), "obs.radar.values"),
        (lambda o: o.__setitem__("obs.swath.id", torch.zeros(2, 1)), "obs.swath.id"),
        (lambda o: o.__setitem__("obs.stations.values", torch.zeros(2, 40, 2)), "obs.stations.values"),
        (lambda o: o.__setitem__("obs.swath.values", torch.zeros(2, 1, 5, 5)), "obs.swath.values"),
    ],
)
def test_bad_obs_keys_and_shapes_raise_value_error_naming_the_key(change, match):
    enc = make_encoder()
    obs = make_obs()
    change(obs)
    with pytest.raises(ValueError, match=match.replace(".", r"\.")):
        enc.embed(obs)


def test_bad_deny_static_and_stream_definitions_raise():
    enc = make_encoder()
    obs = make_obs()
    with pytest.raises(ValueError, match="'radar'"):
        enc.embed(obs, deny=["radar"])
    with pytest.raises(ValueError, match="static"):
        enc(obs, torch.zeros(2, 3, H, W))
    with pytest.raises(ValueError, match="embedding must be one of"):
        StreamInput("x", "swath", 1)
    with pytest.raises(ValueError, match="latitude and longitude"):
        StreamInput("x", "grid_to_grid", 1)
    with pytest.raises(ValueError, match="unique"):
        ObsEncoder([STREAMS[0], STREAMS[0]], LAT, LON, 0, 1)


def make_decoder(periodic=True, n_features=1):
    torch.manual_seed(0)
    return StationDecoder(4, 2, LAT, LON, hidden=16, n_features=n_features, periodic_longitude=periodic)


def test_decoder_shapes_and_gradients():
    dec = make_decoder()
    state, coords = torch.randn(2, 4, H, W), make_obs()["obs.stations.coords"]
    y = dec(state, coords, torch.randn(2, 40, 1))
    assert y.shape == (2, 40, 2)
    y.square().mean().backward()
    assert dec.setconv.log_length_scale.grad is not None
    with pytest.raises(ValueError, match="features"):
        dec(state, coords)
    with pytest.raises(ValueError, match="state"):
        dec(torch.randn(2, 3, H, W), coords, torch.randn(2, 40, 1))
    assert make_decoder(n_features=0)(state, coords).shape == (2, 40, 2)


def test_periodic_decoder_commutes_with_a_longitude_shift():
    """Roll the state k columns east and move the stations k grid steps east: the gridded features read at the
    stations are unchanged (circular padding + wrapped SetConv). A full turn (+360 deg) changes nothing at all."""
    dec = make_decoder(n_features=0)
    state, coords = torch.randn(1, 4, H, W), make_obs(b=1)["obs.stations.coords"]
    k = 5
    shifted = coords.clone()
    shifted[..., 1] += k * 360.0 / W
    # the MLP also sees sin/cos(lon) of the station, so compare the part the circular padding governs
    feats = dec.setconv.grid_to_points(torch.cat([dec.convs(state), state], 1), LAT, LON, coords)
    rolled = torch.roll(state, k, dims=-1)
    feats_rolled = dec.setconv.grid_to_points(torch.cat([dec.convs(rolled), rolled], 1), LAT, LON, shifted)
    torch.testing.assert_close(feats, feats_rolled, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dec(state, coords), dec(state, coords + torch.tensor([0.0, 360.0])))
