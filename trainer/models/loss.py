"""Output projection + cross-entropy in one pass over token chunks (what the training loop uses).

The plain path materialises float32 logits [tokens, vocab] (for Llama 3's 128k vocabulary and
8k tokens that is 4 GiB per sequence), then log-softmax reads and writes them again, and its
backward does it once more (plus a zero-filled one-hot gradient of the same size). Here each
chunk of tokens computes its logits, its loss and, right away, its gradients (softmax - one_hot),
so the logits of one chunk are all that ever exist and they stay in cache. The gradients for the
hidden states and the weight are kept for backward.

Per chunk, the [chunk, vocab] logits see: the matmul that writes them, one `log_softmax` (its
fused kernel, into a buffer reused by every chunk), one `exp_` (log-probabilities -> softmax, in
place) and the two matmuls that read them; the per-token scale of the mean (1/count, 0 for
ignored labels) is applied to the [chunk, hidden] side instead of the [chunk, vocab] side. Same maths as
`F.cross_entropy(F.linear(h, w).float(), labels)` (mean over non-ignored labels).
Without grad (evaluation) only the loss is computed.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
# Logit elements per chunk: 2**23 float32 = 32 MiB (1024 tokens of an 8k vocabulary, 64 of a 128k
# one). Big enough for efficient matmuls (on CPU 1024 x 8k chunks measured faster than 256, 512
# or 2048), small enough that a chunk's logits are a small fraction of the plain path's.
CHUNK_ELEMENTS = 1 << 23


def default_chunk_size(num_tokens: int, vocab_size: int) -> int:
    return max(64, min(num_tokens, CHUNK_ELEMENTS // vocab_size))


# The [chunk, vocab] buffers of the last call, reused by the next one with the same shape. On CPU a
# fresh allocation this large is a fresh mmap, and first-touching its pages cost more than the
# log-softmax that fills them; GPUs have a caching allocator, so this matters there less but
# costs nothing. Not for concurrent use: a training process runs one loss at a time.
_buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}


def _chunk_buffers(rows: int, vocab: int, dtype: torch.dtype, device: torch.device):
    """(logits, log-probabilities) float32 [rows, vocab], and one in `dtype` for the matmuls'
    side when they run in lower precision (else None)."""
    key = (rows, vocab, dtype, device)
    if key not in _buffers:
        _buffers.clear()  # one shape at a time: a new shape (evaluation, a last short batch) replaces it
        logits = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        low = None if dtype == torch.float32 else torch.empty(rows, vocab, dtype=dtype, device=device)
        _buffers[key] = (logits, torch.empty_like(logits), low)
    return _buffers[key]


def _compute(hidden, weight, labels, chunk_size: int, ignore_index: int, with_grads: bool):
    device_type = hidden.device.type
    # Under autocast the matmuls run in the autocast dtype, as F.linear would; softmax in float32.
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    with torch.autocast(device_type, enabled=False):
        h, w = hidden.to(dtype), weight.to(dtype)
        valid = labels != ignore_index
        targets = labels.masked_fill(~valid, 0)[:, None]
        count = valid.sum().clamp(min=1)
        # d(mean loss)/d(per-token loss): 1/count, 0 where ignored. Applied to [chunk, hidden]
        # tensors (the matmuls are linear in it), never to the [chunk, vocab] ones.
        scale = (valid.to(torch.float32) / count)[:, None]
        losses = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        grad_hidden = torch.empty_like(hidden) if with_grads else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
        rows = min(chunk_size, h.shape[0])
        logits_buf, logp_buf, low_buf = _chunk_buffers(rows, w.shape[0], dtype, h.device)
        for start in range(0, h.shape[0], chunk_size):
            end = min(start + chunk_size, h.shape[0])
            n = end - start
            h_c, t_c, s_c = h[start:end], targets[start:end], scale[start:end]
            if low_buf is None:
                logits = torch.mm(h_c, w.t(), out=logits_buf[:n])
            else:  # bf16/fp16 matmul into its own buffer, softmax in float32
                logits = logits_buf[:n].copy_(torch.mm(h_c, w.t(), out=low_buf[:n]))
            logp = torch._log_softmax(logits, -1, False, out=logp_buf[:n])
            losses[start:end] = logp.gather(1, t_c).squeeze(1).neg_()
            if not with_grads:
                continue
            g = logp.exp_()  # softmax, in place
            g.scatter_add_(1, t_c, g.new_full((n, 1), -1.0))  # softmax - one_hot
            if low_buf is not None:
                g = low_buf[:n].copy_(g)  # (a float32 -> bf16 `exp(out=...)` measured 5x slower on CPU)
            grad_hidden[start:end] = (g @ w).mul_(s_c.to(dtype))
            h_scaled = h_c * s_c.to(dtype)
            if low_buf is None:
                grad_weight.addmm_(g.t(), h_scaled)
            else:
                grad_weight += (g.t() @ h_scaled).float()
        loss = (losses * valid).sum() / count
    return loss, grad_hidden, grad_weight


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size: int, ignore_index: int):
        loss, grad_hidden, grad_weight = _compute(hidden, weight, labels, chunk_size, ignore_index, True)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            grad_weight * grad_loss.to(grad_weight.dtype),
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden [N, d] @ weight[V, d].T` against `labels [N]` (float32 scalar)."""
    chunk_size = chunk_size or default_chunk_size(hidden.shape[0], weight.shape[0])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_size, ignore_index)
    return _compute(hidden, weight, labels, chunk_size, ignore_index, False)[0]
