"""A Tensor subclass importable by the oracle subprocess (needs torch)."""

from __future__ import annotations

import torch


class MyTensor(torch.Tensor):
    pass
