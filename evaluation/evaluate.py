"""Validation pass: exact top-1/top-5, the head's Fenchel-Young loss and mean support size.

Each rank evaluates its own shard (`data.build_eval_loader`: rank r gets r::world_size, no padding,
no duplicates); the per-rank sums are added with `accelerator.reduce`, so counts are exact.
The unwrapped module is used (no DDP collectives in eval, shards may differ in length) under the
accelerator's autocast; the loss is computed in fp32 on the logits.
"""
import torch


@torch.no_grad()
def evaluate(model, loader, accelerator):
    """-> {"top1", "top5", "loss", "support_size", "n"} over the whole (sharded) split."""
    module = accelerator.unwrap_model(model)
    head = module.output_head
    was_training = module.training
    module.eval()
    device = accelerator.device
    sums = torch.zeros(5, dtype=torch.float64, device=device)  # correct1, correct5, loss, support, n
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with accelerator.autocast():
            logits = module(images)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        topk = logits.topk(k, dim=-1).indices
        hits = topk.eq(labels[:, None])
        probs = head(logits)
        sums += torch.stack([
            hits[:, 0].sum().double(),
            hits.any(dim=1).sum().double(),
            head.loss(logits, labels, reduction="sum").double(),
            head.support_size(probs).sum().double(),
            torch.tensor(float(labels.numel()), dtype=torch.float64, device=device),
        ])
    sums = accelerator.reduce(sums, reduction="sum") if accelerator.num_processes > 1 else sums
    if was_training:
        module.train()
    n = int(sums[4].item())
    denom = max(n, 1)
    return {
        "top1": sums[0].item() / denom,
        "top5": sums[1].item() / denom,
        "loss": sums[2].item() / denom,
        "support_size": sums[3].item() / denom,
        "n": n,
    }
