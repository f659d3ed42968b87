"""What mkldnn's ``convolution_backward`` allocates above its outputs for a depthwise convolution, by input layout.

    python benchmarks/depthwise_buffer.py

One eager op per row (one thread, fp32, CPU profiler memory events, ``fxremat.measure.cpu_peak_bytes``): the weight
and input gradients of a depthwise convolution, with the input, the output gradient and the weight each contiguous
or channels-last (and the input in the N, H, C, W order Inductor gave PyTorch's split on MobileNetV3-Small).  The
buffer ``passes/simulator/layout.py`` models (``depthwise_buffer_bytes``: out channels x kh x kw x 1 KiB) shows as
"above outputs" on the rows with a channels-last input and a kernel above 3x3.
"""

from __future__ import annotations

import itertools

import torch

from fxremat.measure import cpu_peak_bytes

LAYOUTS = ("contiguous", "channels_last", "nhcw")
CASES = ((576, 4, 5), (576, 4, 3), (64, 8, 7))  # (channels, image side, kernel)


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "nhcw":
        return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    return t.contiguous()


def main() -> None:
    torch.set_num_threads(1)
    print("| channels | side | kernel | input | output grad | weight | peak in op (B) | above outputs (B) |")
    print("|---|---|---|---|---|---|---|---|")
    for channels, side, kernel in CASES:
        x0, g0 = torch.randn(2, channels, side, side), torch.randn(2, channels, side, side)
        w0 = torch.randn(channels, 1, kernel, kernel)
        for xl, gl, wl in itertools.product(LAYOUTS, LAYOUTS[:2], LAYOUTS[:2]):
            x, g, w = _laid_out(x0, xl), _laid_out(g0, gl), _laid_out(w0, wl)
            pad = [kernel // 2] * 2

            def op():
                geometry = ([1, 1], pad, [1, 1], False, [0, 0], channels)
                return torch.ops.aten.convolution_backward(g, x, w, [0], *geometry, [True, True, False])

            op()  # oneDNN's primitive cache
            peak = cpu_peak_bytes(op)
            outputs = x.numel() * 4 + w.numel() * 4
            print(f"| {channels} | {side} | {kernel}x{kernel} | {xl} | {gl} | {wl} | {peak:,} | {peak - outputs:,} |")


if __name__ == "__main__":
    main()
