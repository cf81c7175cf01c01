"""Output projection + cross-entropy in one pass over token chunks.

The plain path materialises float32 logits [tokens, vocab] (for Llama 3's 128k vocabulary and
8k tokens that is 4 GiB per sequence), then log-softmax reads and writes them again, and its
backward does it once more. Here each chunk of tokens computes its logits, its loss and, right
away, its gradients (softmax - one_hot), so the logits of one chunk are all that ever exist and
they stay in cache. The gradients for the hidden states and the weight are kept for backward.
Same maths as `F.cross_entropy(F.linear(h, w).float(), labels)` (mean over non-ignored labels).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size: int, ignore_index: int):
        device_type = hidden.device.type
        # Under autocast the matmuls run in the autocast dtype, as F.linear would; softmax in float32.
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
        with torch.autocast(device_type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            valid = labels != ignore_index
            targets = labels.masked_fill(~valid, 0)
            count = valid.sum().clamp(min=1)
            scale = valid.to(torch.float32) / count  # d(mean loss)/d(per-token loss); 0 where ignored
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, h.shape[0], chunk_size):
                end = min(start + chunk_size, h.shape[0])
                h_c, t_c = h[start:end], targets[start:end]
                logits = (h_c @ w.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                total += ((lse - logits.gather(1, t_c[:, None]).squeeze(1)) * valid[start:end]).sum()
                grad_logits = logits.sub_(lse[:, None]).exp_()  # softmax, in place
                grad_logits.scatter_add_(1, t_c[:, None], grad_logits.new_full((end - start, 1), -1.0))
                grad_logits.mul_(scale[start:end, None])
                g = grad_logits.to(dtype)
                grad_hidden[start:end] = g @ w
                if dtype == torch.float32:
                    grad_weight.addmm_(g.t(), h_c)
                else:
                    grad_weight += (g.t() @ h_c).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss.to(grad_weight.dtype), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
    chunk_size: int = 512, ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden [N, d] @ weight[V, d].T` against `labels [N]` (float32 scalar)."""
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_size, ignore_index)
