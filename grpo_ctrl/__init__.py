"""grpo-ctrl: train pendulum controllers with GRPO, export them, run them on the rig.

With gymnasium installed (the ``gym`` extra), ``import grpo_ctrl`` registers
the Gymnasium environments ``grpo_ctrl/Pendulum-v0``, ``grpo_ctrl/CartPole-v0``
and ``grpo_ctrl/Furuta-v0`` (the preset a keyword; ``grpo_ctrl.gym_env``),
before or after ``import gymnasium``: the package does not import gymnasium
itself (the command line stays quick to start); if gymnasium is not loaded
yet, the ids are registered the moment it is.
"""
import sys

__version__ = "0.1.0"


def _register_gymnasium_ids() -> None:
    import grpo_ctrl.gym_env  # noqa: F401  (registers on import)


class _AfterGymnasium:
    """A meta-path finder that lets ``gymnasium`` load as usual, then
    registers the ids (once: it removes itself at the first look-up)."""

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            _register_gymnasium_ids()
        except ImportError:  # a gymnasium too old for the adapters: no ids
            pass

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


if sys.modules.get("gymnasium") is not None:
    try:
        _register_gymnasium_ids()
    except ImportError:
        pass
elif "gymnasium" not in sys.modules:  # (None there: gymnasium blocked on purpose)
    sys.meta_path.insert(0, _AfterGymnasium())
