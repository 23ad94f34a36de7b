"""BatchSim.copier (copy_envs made ready once) and step_counts (get_state()["t"] uncopied)."""
import numpy as np
import pytest

from grpo_ctrl.sim import BatchSim


def test_a_copier_copies_as_copy_envs_does():
    src = BatchSim("pendulum", 4, preset="gym", seed=3)
    src.step(np.full(4, 0.5, np.float32))
    a, b = (BatchSim("pendulum", 6, preset="gym", seed=7) for _ in range(2))
    dst, from_ = np.array([5, 0, 2]), np.array([1, 3, 1])
    copy = a.copier(dst, src, from_)
    src.step(np.full(4, -0.25, np.float32))  # copies the state as it is when called
    copy()
    b.copy_envs(dst, src, from_)
    for key, value in b.get_state().items():
        np.testing.assert_array_equal(a.get_state()[key], value, err_msg=key)


def test_a_copier_checks_once_and_refuses_what_copy_envs_refuses():
    src = BatchSim("pendulum", 4, preset="gym")
    dst = BatchSim("pendulum", 4, preset="gym")
    with pytest.raises(ValueError):
        dst.copier([0, 1], src, [0])
    with pytest.raises(ValueError):
        dst.copier([0], src, [4])
    with pytest.raises(ValueError):
        dst.copier([0], dst, [1])  # onto itself: copy_envs' slow path
    with pytest.raises(ValueError):
        dst.copier([0], BatchSim("cartpole", 2, preset="gym"), [0])


def test_step_counts_are_the_state_t():
    sim = BatchSim("pendulum", 3, preset="gym")
    for _ in range(4):
        sim.step(np.zeros(3, np.float32))
    sim.reset(mask=np.array([False, True, False]))
    np.testing.assert_array_equal(sim.step_counts(), sim.get_state()["t"])
    np.testing.assert_array_equal(sim.step_counts(), [4, 0, 4])


def test_a_copier_without_sources_takes_them_at_each_call():
    src = BatchSim("pendulum", 5, preset="gym", seed=3)
    src.step(np.full(5, 0.5, np.float32))
    a, b = (BatchSim("pendulum", 3, preset="gym", seed=7) for _ in range(2))
    copy = a.copier(np.arange(3), src)
    for sources in ([4, 0, 4], [1, 2, 3]):
        copy(np.array(sources, np.int32))
        b.copy_envs(np.arange(3), src, sources)
        for key, value in b.get_state().items():
            np.testing.assert_array_equal(a.get_state()[key], value, err_msg=key)
    before = a.get_state()
    for bad in (np.array([0, 1, 5], np.int32), np.array([0, 1, -1], np.int32),
                np.array([0, 1, 2]), np.array([0, 1], np.int32), [0, 1, 2]):
        with pytest.raises(ValueError):
            copy(bad)
    for key, value in a.get_state().items():  # nothing copied by a refused call
        np.testing.assert_array_equal(before[key], value, err_msg=key)
