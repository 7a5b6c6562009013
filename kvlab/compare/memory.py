"""Process memory figures, each labelled with what it is.

RSS is the whole process's resident set (weights, activations, caches, Python);
CUDA allocated/peak come from torch's caching allocator on the model's device
(0 without CUDA). Peaks are reset when a tracker is created, i.e. before each
run. None of these is a cache size: see `kvlab.accounting` for that.
"""

from __future__ import annotations

import psutil
import torch


class MemoryTracker:
    """Samples (rss_bytes, cuda_allocated_bytes, cuda_peak_bytes) for one run."""

    def __init__(self, device: torch.device):
        self.process = psutil.Process()
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def sample(self) -> tuple[int, int, int]:
        rss = self.process.memory_info().rss
        if not self.cuda:
            return rss, 0, 0
        return rss, torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device)
