"""The overlay strategy (seed 002, "OverlaySandbox"): the sandbox class in
:mod:`~sandbox_core.strategies.overlay.sandbox`, the kernel OverlayFS mechanics in
:mod:`~sandbox_core.strategies.overlay.mount`."""

from sandbox_core.strategies.overlay.sandbox import OverlaySandbox

__all__ = ["OverlaySandbox"]
