"""``grpo-ctrl train --fit uno|m4``: the network chosen for a board before
training starts.

The rule: the on-device tick (``fw_tick`` with the firmware core calling the
policy: the observation from the encoder counts, the policy, the clamp, the
STATE frame) must take at most ``SHARE`` (25 %) of the preset's control
period on the board's clock. The rig's 200 Hz on the Uno's 16 MHz: 20,000
cycles. The chooser walks the networks no larger than the preset's (hidden
width, hidden layers; no Fourier features, whose sines the chips pay for;
float, then the hidden-to-hidden layers in q15, then on the Uno the whole
network in int16) from the most multiply-adds
down, and takes the first whose tick, counted as ``grpo-ctrl bench boards``
counts it (simavr's cycles for the Uno, the Cortex-M4 TRM model on QEMU's
trace for the M4), is within the budget. The board's cycle model
(``board_fit.tick_estimate``, within about 10 % of those counts) skips the
networks clearly over; the count decides. Without the emulator the model
alone decides, and the line says so.

With ``--hidden`` or ``--layers`` given, that network is checked rather than
chosen. Nothing fitting is a one-line refusal (exit 2).

This module is the ``train`` command (``cli.COMMANDS``): ``train``'s own
arguments and ``--fit``, then ``train.run`` with the chosen network.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from grpo_ctrl import train
from grpo_ctrl.errors import UserError

BOARD_OF = {"uno": "uno", "m4": "mps2-an386"}  # --fit name -> grpo-ctrl firmware --board
SHARE = 0.25        # of the control period, for the on-device tick
MODEL_SLACK = 1.15  # networks the cycle model puts above budget x this are not measured
SYSTEMS = ("pendulum",)  # the boards' firmware: the pendulum's core (one encoder, one motor)


@dataclass(frozen=True)
class Network:
    layers: int
    hidden: int
    quantize: str | None  # None (float), "q15" (the hidden-to-hidden layers), "int16" (all)

    def macs(self, nobs: int) -> int:
        return nobs * self.hidden + (self.layers - 1) * self.hidden ** 2 + self.hidden

    def describe(self, nobs: int) -> str:
        shape = "-".join(str(n) for n in (nobs, *[self.hidden] * self.layers, 1))
        return f"{shape} ({self.quantize or 'float'}, {self.macs(nobs)} multiply-adds)"


@dataclass
class Choice:
    network: Network
    board: str           # grpo-ctrl firmware's name of the board
    cycles: float        # the tick with it: measured, or estimated where ``measured`` is False
    budget: float
    measured: bool
    refused: list        # (Network, cycles, measured) of the larger ones, over the budget

    def line(self, nobs: int, rate_hz: float, clock_hz: int) -> str:
        how = "counted on the emulator" if self.measured else "estimated by the cycle model"
        return (f"fit {self.board}: hidden {self.network.hidden} x {self.network.layers} layers, "
                f"no Fourier features, {self.network.quantize or 'float'} "
                f"({self.network.describe(nobs)}): on-device tick {self.cycles:,.0f} cycles "
                f"({how}) of {self.budget:,.0f} = {100 * SHARE:.0f} % of the {rate_hz:g} Hz "
                f"period at {clock_hz / 1e6:g} MHz")


def candidates(max_hidden: int, max_layers: int, nobs: int, quantize: bool = True,
               int16: bool = False) -> list:
    """Networks no larger than ``max_hidden`` x ``max_layers``, most
    multiply-adds first; at equal size float before q15 before int16, more
    layers first. q15 applies to hidden-to-hidden layers of an even width
    (two outputs a pass): one-layer and odd-width networks are float.
    ``int16`` (a chip without an FPU: the Uno): every network also in
    int16, up to ``int16.MAX_MACS`` multiply-adds."""
    from grpo_ctrl.export.int16 import MAX_MACS

    nets = [Network(L, h, q) for L in range(1, max_layers + 1) for h in range(1, max_hidden + 1)
            for q in ((None, "q15") if quantize and L > 1 and h % 2 == 0 else (None,))]
    if int16:
        nets += [Network(L, h, "int16") for L in range(1, max_layers + 1)
                 for h in range(1, max_hidden + 1)
                 if Network(L, h, None).macs(nobs) <= MAX_MACS]
    order = {None: 0, "q15": 1, "int16": 2}
    return sorted(nets, key=lambda n: (-n.macs(nobs), order[n.quantize], -n.layers))


def random_onnx(system: str, preset: str, net: Network):
    """The deployed controller's graph (normalisation, the mean network,
    tanh, scaling, clamp) for ``net`` with random weights, all positive, so
    that every ReLU passes its input on: software floating point (AVR) takes
    less time on a zero, and a trained network's units are active where it
    acts. With the zeros of random signs the rig's 3-2-2-1 measured 19,012
    cycles; the LQR's gains in it 20,127; all active 20,911."""
    import torch

    from grpo_ctrl.export.onnx_export import to_onnx
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.policy import GaussianPolicy

    spec = plant_spec(system, preset)
    torch.manual_seed(net.hidden * 100 + net.layers)
    policy = GaussianPolicy(spec.nobs, spec.u_max, net.hidden, net.layers, "relu")
    with torch.no_grad():  # every unit active: no product by a ReLU's zero
        for layer in policy.net:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.abs_().add_(0.1)
                layer.bias.abs_().add_(0.1)
    return to_onnx(policy.controller(spec))


def choose(fit: str, system: str, preset: str, max_hidden: int, max_layers: int,
           exact: bool = False, measure: bool = True) -> Choice:
    """The largest network within ``SHARE`` of the period on board ``fit``
    (``exact``: only ``max_hidden`` x ``max_layers``, float or q15).
    UserError (one line) when none fits."""
    from grpo_ctrl.export.verify import operating_observations
    from grpo_ctrl.firmware_bridge.board_emulate import emulator_missing
    from grpo_ctrl.firmware_bridge.board_fit import measured_tick, tick_estimate
    from grpo_ctrl.firmware_bridge.board_registry import board
    from grpo_ctrl.plant import plant_spec

    if fit not in BOARD_OF:
        raise UserError(f"--fit takes {' or '.join(BOARD_OF)}, got {fit!r}")
    if system not in SYSTEMS:
        raise UserError(f"--fit: the boards' firmware runs the {', '.join(SYSTEMS)}, not the "
                        f"{system}")
    b = board(BOARD_OF[fit])
    spec = plant_spec(system, preset)
    budget = SHARE * b.clock_hz * spec.dt
    missing = emulator_missing(b) if measure else "not asked to"
    obs = operating_observations(system, preset, 2) if missing is None else None
    nets = candidates(max_hidden, max_layers, spec.nobs, int16=b.timed_on_device)
    if exact:
        nets = [n for n in nets if n.hidden == max_hidden and n.layers == max_layers]
    refused = []
    for net in nets:
        # the model on the analytic counts first: the C is generated only near the budget
        rough = tick_estimate(b, _rough_size(b, net, spec.nobs))
        if rough > MODEL_SLACK * budget:
            continue
        src = _controller_c(b, random_onnx(system, preset, net), net.quantize, system, preset)
        est = tick_estimate(b, src.size)
        if est > MODEL_SLACK * budget or (missing and est > budget):
            refused.append((net, est, False))
            continue
        if missing:
            return Choice(net, b.name, est, budget, False, refused)
        cycles = measured_tick(b, src, obs)
        if cycles <= budget:
            return Choice(net, b.name, cycles, budget, True, refused)
        refused.append((net, cycles, True))
    smallest = nets[-1] if nets else Network(max_layers, max_hidden, None)
    counted = {n: c for n, c, _ in refused}
    if smallest in counted:
        cycles = counted[smallest]
    else:
        src = _controller_c(b, random_onnx(system, preset, smallest), smallest.quantize, system,
                            preset)
        cycles = tick_estimate(b, src.size)
    raise UserError(
        f"--fit {fit}: no network fits {100 * SHARE:.0f} % of the {1 / spec.dt:g} Hz period on the "
        f"{b.name} ({budget:,.0f} cycles): the smallest tried, "
        f"{smallest.describe(spec.nobs)}, takes about {cycles:,.0f}")


def _controller_c(b, model, quantize, system: str, preset: str):
    """The C the board links for ``model`` (``board_fit.controller_c``); in q15
    or int16 calibrated on the plant's operating range without the accuracy check that
    random weights need not pass (timing does not depend on it)."""
    from grpo_ctrl.export.c_codegen import generate_c
    from grpo_ctrl.export.verify import operating_observations
    from grpo_ctrl.firmware_bridge.board_fit import controller_c

    if not quantize:
        return controller_c(b, model)
    return generate_c(model, "policy", pack=b.pack_weights, block=b.block, quantize=quantize,
                      calibration=operating_observations(system, preset, seed=0))


class _Size:  # the SizeReport fields tick_estimate reads
    def __init__(self, macs, packed_macs=0, q15_macs=0, q15_io=0, int16_macs=0):
        self.macs, self.packed_macs, self.q15_macs, self.q15_io = macs, packed_macs, q15_macs, q15_io
        self.int16_macs = int16_macs


def _rough_size(b, net: Network, nobs: int) -> _Size:
    """The counts ``c_codegen`` reports for ``net``, from its shape: q15 on each
    hidden-to-hidden layer (its inputs quantised, outputs converted back);
    packed where the board packs a square layer of at least 256 weights."""
    square = (net.layers - 1) * net.hidden ** 2
    if net.quantize == "int16":
        return _Size(net.macs(nobs), int16_macs=net.macs(nobs))
    if net.quantize:
        return _Size(net.macs(nobs), 0, square, 2 * net.hidden * (net.layers - 1))
    return _Size(net.macs(nobs), square if b.pack_weights and net.hidden ** 2 >= 256 else 0)


# ---------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    train.add_arguments(p)
    p.add_argument("--fit", choices=list(BOARD_OF),
                   help="choose the network before training so that the on-device tick "
                        "(fw_tick + the policy) takes at most 25 %% of the preset's period on "
                        "the board (uno: ATmega328P 16 MHz, counted on simavr; m4: the "
                        "Cortex-M4F of the mps2-an386 at 25 MHz, the TRM model on QEMU's "
                        "trace): the largest no larger than the preset's, Fourier features "
                        "off, float or q15 (on the uno also the whole network in int16). With "
                        "--hidden/--layers: check that one")


def run(args) -> int:
    if getattr(args, "fit", None):
        apply_fit(args)
    return train.run(args)


def apply_fit(args) -> Choice:
    """Choose (or check) the network for ``args.fit`` and write it into the
    training arguments; print the one line."""
    from grpo_ctrl.firmware_bridge.board_registry import board
    from grpo_ctrl.grpo_config import default_config
    from grpo_ctrl.plant import plant_spec, resolve_plant

    file_cfg = train.read_toml(args.config) if args.config else {}
    system, preset = resolve_plant(args.system or file_cfg.get("system") or "pendulum",
                                   args.preset or file_cfg.get("preset"))
    defaults = default_config(system, preset)
    given_h = args.hidden if args.hidden is not None else file_cfg.get("hidden")
    given_l = args.layers if args.layers is not None else file_cfg.get("layers")
    exact = given_h is not None or given_l is not None
    choice = choose(args.fit, system, preset, given_h or defaults.hidden,
                    given_l or defaults.layers, exact=exact)
    args.hidden, args.layers, args.features = choice.network.hidden, choice.network.layers, 0
    b, spec = board(choice.board), plant_spec(system, preset)
    print(choice.line(spec.nobs, 1 / spec.dt, b.clock_hz) +
          f"; deploy with grpo-ctrl firmware --board {choice.board} --policy P" +
          (f" --quantize {choice.network.quantize}" if choice.network.quantize else ""),
          flush=True)
    return choice
