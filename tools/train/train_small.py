#!/usr/bin/env python3
"""Train swiftlet's small Qwen3-Next-architecture model on the corpus of tools/corpus.

Usage (on the GPU machine: torch + transformers 5.x + tokenizers):
    train_small.py --corpus DIR --tokenizer DIR --out DIR [--steps N | --time-budget S] [--seed 1234]
    # longer than one device call: stop and save the state, then continue in the next call
    train_small.py ... --steps N --stop-after 540 --state /tmp/st.pt
    train_small.py ... --steps N --stop-after 540 --state /tmp/st.pt --resume /tmp/st.pt

DIR of --corpus holds train.txt / val.txt / test.txt (tools/corpus/build_corpus.py, .xz allowed);
--tokenizer holds the Qwen3 tokenizer.json and tokenizer_config.json (chat template).

The model (`model_config`) has the Qwen3-Next architecture with the routing shape of the real
Qwen3.5-35B-A3B: Gated DeltaNet and gated attention 3:1, 256 experts with 8 per token plus a
shared expert with its gate, zero-centred norms, the full Qwen3 vocabulary (151,669) with tied
embeddings. Its sizes are set by the shipped 4-bit container (<= 32 MiB with the tokenizer):
hidden 128 and 4 layers, each expert 128 x 64 (one 16 KiB blob at 4 bits).

Training: documents packed into sequences of --seq tokens at seeded random offsets, AdamW
(beta 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 10%, bf16
autocast over fp32 weights, gradient clipping at 1, and transformers' router load-balancing loss
(`output_router_logits`, coefficient `router_aux_loss_coef`). The loss curve goes to
OUT/train_log.csv; at the end the model is saved in bf16 (safetensors + config + tokenizer files)
under OUT/checkpoint and evaluated: the test split's perplexity as `swiftlet perplexity` defines it
(windows of 512 tokens, the second half of each scored) in bf16 and fp32, the routers' expert
load, and greedy answers to a few chat prompts. OUT/report.json holds the figures.
"""

import argparse
import csv
import json
import lzma
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch

EOT_ID = 151643      # <|endoftext|>
IM_END_ID = 151645   # <|im_end|>
VOCAB = 151669       # 151,643 byte-level BPE tokens + 26 added tokens


def log(*a):
    print(*a, flush=True)


def model_config(router_aux=0.01):
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=64,
        shared_expert_intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], full_attention_interval=4, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
        output_router_logits=True, router_aux_loss_coef=router_aux, initializer_range=0.02,
        bos_token_id=EOT_ID, eos_token_id=IM_END_ID, pad_token_id=EOT_ID,
    )


def read_split(path):
    if os.path.exists(path + ".xz"):
        with lzma.open(path + ".xz", "rt", encoding="utf-8") as fh:
            return fh.read()
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def tokenize(tok, text):
    """The file's token stream: documents split at <|endoftext|>, each encoded (special tokens
    parsed) and followed by the <|endoftext|> id, exactly as encoding the whole file would."""
    docs = text.split("<|endoftext|>")
    if docs and docs[-1] == "":
        docs.pop()
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(EOT_ID)
    return np.asarray(out, dtype=np.int64)


def chat_prompt(question):
    return "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n"


def check_template(tok_dir):
    """The corpus renders chat turns by hand; they must equal the real template's rendering."""
    from transformers import AutoTokenizer
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus"))
    from build_corpus import chat
    t = AutoTokenizer.from_pretrained(tok_dir)
    turns = [("What is a dog?", "A domestic animal."), ("And a cat?", "A small feline.")]
    for k in (1, 2):
        msgs = []
        for q, a in turns[:k]:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        want = t.apply_chat_template(msgs, tokenize=False)
        got = chat(turns[:k])
        assert want == got, f"chat rendering differs from the template:\n{want!r}\n{got!r}"
    gen = t.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert gen == chat_prompt("Hi"), gen
    log("chat rendering matches the template")


@torch.no_grad()
def perplexity(model, ids, ctx=512, max_windows=None, dtype=None):
    """swiftlet perplexity's definition: full windows of ctx tokens from a fresh state, positions
    ctx/2 .. ctx-2 scored (the logits at j predict token j+1)."""
    n = len(ids) // ctx
    if max_windows:
        n = min(n, max_windows)
    first = ctx // 2
    nll, count = 0.0, 0
    per_window = []
    dev = next(model.parameters()).device
    for w in range(n):
        x = torch.tensor(ids[w * ctx:(w + 1) * ctx], device=dev)[None]
        logits = model(input_ids=x, use_cache=False).logits[0].double()
        lp = torch.log_softmax(logits[first:ctx - 1], dim=-1)
        tgt = x[0, first + 1:ctx]
        v = -lp.gather(1, tgt[:, None]).squeeze(1)
        nll += v.sum().item()
        count += v.numel()
        per_window.append(v.mean().item())
    return {"windows": n, "scored": count, "nll": nll / count, "ppl": math.exp(nll / count),
            "window_nll": per_window}


@torch.no_grad()
def expert_load(model, ids, ctx=512, windows=8):
    """Share of routed (token, choice) pairs each expert received, per layer."""
    dev = next(model.parameters()).device
    E = model.config.num_experts
    k = model.config.num_experts_per_tok
    counts = None
    for w in range(min(windows, len(ids) // ctx)):
        x = torch.tensor(ids[w * ctx:(w + 1) * ctx], device=dev)[None]
        out = model(input_ids=x, use_cache=False, output_router_logits=True)
        layers = [r.float() for r in out.router_logits]
        if counts is None:
            counts = np.zeros((len(layers), E))
        for li, r in enumerate(layers):
            top = r.view(-1, E).topk(k, dim=-1).indices.flatten().cpu().numpy()
            counts[li] += np.bincount(top, minlength=E)
    share = counts / counts.sum(1, keepdims=True)
    ent = -(share * np.log(np.maximum(share, 1e-12))).sum(1) / math.log(E)
    return {"normalised_entropy": ent.round(4).tolist(), "max_share": share.max(1).round(4).tolist(),
            "unused_experts": (counts == 0).sum(1).tolist()}


@torch.no_grad()
def greedy(model, tok, question, n=48):
    dev = next(model.parameters()).device
    ids = tok.encode(chat_prompt(question), add_special_tokens=False).ids
    x = torch.tensor(ids, device=dev)[None]
    out = []
    for _ in range(n):
        nxt = int(model(input_ids=x, use_cache=False).logits[0, -1].argmax())
        out.append(nxt)
        if nxt in (IM_END_ID, EOT_ID):
            break
        x = torch.cat([x, torch.tensor([[nxt]], device=dev)], 1)
    return ids, out, tok.decode(out, skip_special_tokens=False)


def lm_loss(model, x, router_aux, chunk=8192):
    """Mean next-token cross-entropy of x (B, T) and the router load-balancing loss. The logits
    (151,669 a token) are made chunk by chunk under activation checkpointing, so a large batch
    never holds them all."""
    from torch.utils.checkpoint import checkpoint
    from transformers.models.qwen3_next.modeling_qwen3_next import load_balancing_loss_func
    out = model.model(input_ids=x, use_cache=False, output_router_logits=router_aux > 0)
    h = out.last_hidden_state[:, :-1].reshape(-1, model.config.hidden_size)
    tgt = x[:, 1:].reshape(-1)
    weight = model.lm_head.weight

    def piece(hc, tc):
        logits = torch.nn.functional.linear(hc, weight).float()
        return torch.nn.functional.cross_entropy(logits, tc, reduction="sum")

    total = sum(checkpoint(piece, h[i:i + chunk], tgt[i:i + chunk], use_reentrant=False)
                for i in range(0, h.shape[0], chunk))
    loss = total / tgt.numel()
    aux = torch.zeros((), device=x.device)
    if router_aux > 0:
        aux = load_balancing_loss_func(out.router_logits, model.config.num_experts,
                                       model.config.num_experts_per_tok, None)
    return loss, aux


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in n else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--time-budget", type=float, default=0,
                    help="set the number of steps from the step rate measured over the first 20 steps")
    ap.add_argument("--stop-after", type=float, default=0,
                    help="save the training state to --state after this many seconds of this call and exit")
    ap.add_argument("--state", default="train_state.pt")
    ap.add_argument("--resume", default="", help="continue from a state saved by --stop-after")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--router-aux", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--experts-impl", default="grouped_mm")
    ap.add_argument("--eval-windows", type=int, default=0, help="limit the test perplexity (0: all)")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    from transformers import Qwen3NextForCausalLM

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    check_template(args.tokenizer)
    # The checkpoint's tokenizer files go in now: the tokenizer directory may be gone by the end.
    ck = os.path.join(args.out, "checkpoint")
    os.makedirs(ck, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, f), ck)
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    splits = {s: tokenize(tok, read_split(os.path.join(args.corpus, s + ".txt"))) for s in ("train", "val", "test")}
    for s, ids in splits.items():
        log(f"{s}: {len(ids)} tokens")
    log(f"tokenized in {time.time() - t0:.1f} s")

    dev = torch.device("cuda")
    cfg = model_config(args.router_aux)
    try:
        model = Qwen3NextForCausalLM._from_config(cfg, experts_implementation=args.experts_impl)
    except TypeError as e:
        log(f"experts_implementation not accepted ({e}); transformers' default")
        model = Qwen3NextForCausalLM(cfg)
    log(f"experts implementation: {getattr(model.config, '_experts_implementation', None)}")
    model.to(dev).train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"parameters: {n_params} ({n_params / 1e6:.2f} M), experts {args.experts_impl}")

    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    train = torch.from_numpy(splits["train"])
    val = splits["val"]
    gen = torch.Generator().manual_seed(args.seed)

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, total - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    @torch.no_grad()
    def val_loss(n=16):
        model.eval()
        losses = []
        for w in range(n):
            x = torch.tensor(val[w * args.seq:(w + 1) * args.seq], device=dev)[None]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses.append(lm_loss(model, x, 0.0)[0].item())
        model.train()
        return float(np.mean(losses))

    t_train = time.time()
    tokens, step, total, done_s = 0, 0, args.steps, 0.0
    if args.resume:
        st = torch.load(args.resume, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        torch.cuda.set_rng_state(st["cuda_rng"])
        tokens, step, total, done_s = st["tokens"], st["step"], st["total"], st["seconds"]
        log(f"resumed at step {step} of {total} ({tokens} tokens, {done_s:.0f} s)")
    t_train -= done_s
    logf = open(os.path.join(args.out, "train_log.csv"), "a" if args.resume else "w", newline="")
    w = csv.writer(logf)
    if not args.resume:
        w.writerow(["step", "tokens", "seconds", "lr", "loss", "aux_loss", "val_loss"])
    t_call = time.time()
    while step < total:
        if args.stop_after and time.time() - t_call > args.stop_after:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                        "cuda_rng": torch.cuda.get_rng_state(), "tokens": tokens, "step": step,
                        "total": total, "seconds": time.time() - t_train}, args.state)
            log(f"stopped at step {step} of {total}; state saved to {args.state} (continue with --resume)")
            return
        if args.time_budget and step == 20 and not args.resume:
            # Fix the schedule's horizon from the measured step rate; --steps N reproduces it.
            rate = (time.time() - t_train) / 20
            total = max(40, int(20 + (args.time_budget - (time.time() - t_train)) / rate))
            log(f"{rate:.3f} s a step: training {total} steps (reproduce with --steps {total})")
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([train[s:s + args.seq] for s in starts.tolist()]).to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, aux = lm_loss(model, x, args.router_aux)
        opt.zero_grad(set_to_none=True)
        (loss + args.router_aux * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += x.numel()
        if step % 25 == 0 or step == total - 1:
            vl = val_loss() if step % 250 == 0 or step == total - 1 else ""
            el = time.time() - t_train
            w.writerow([step, tokens, round(el, 1), f"{lr_at(step, total):.3e}", f"{loss.item():.4f}",
                        f"{aux.item():.4f}", vl])
            logf.flush()
            log(f"step {step} loss {loss.item():.4f} aux {aux.item():.3f} val {vl} lr {lr_at(step, total):.2e} "
                f"{tokens / el:.0f} tok/s {el:.0f} s")
        step += 1
    step -= 1
    train_s = time.time() - t_train
    final_val = val_loss(32)
    log(f"trained {step + 1} steps, {tokens} tokens in {train_s:.0f} s; val loss {final_val:.4f}")

    ck = os.path.join(args.out, "checkpoint")
    model.to(torch.bfloat16).save_pretrained(ck, max_shard_size="14MB")
    with open(os.path.join(ck, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": EOT_ID, "eos_token_id": [IM_END_ID, EOT_ID], "pad_token_id": EOT_ID,
                   "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}, fh, indent=2)

    # Evaluation of the saved bf16 weights.
    report = {"steps": step + 1, "tokens": tokens, "train_seconds": round(train_s, 1),
              "params": n_params, "final_val_loss": final_val,
              "split_tokens": {s: int(len(v)) for s, v in splits.items()}, "args": vars(args)}
    for dt in (torch.bfloat16, torch.float32):
        m = Qwen3NextForCausalLM.from_pretrained(ck, dtype=dt).to(dev).eval()
        r = perplexity(m, splits["test"], max_windows=args.eval_windows or None)
        key = "bf16" if dt == torch.bfloat16 else "fp32"
        report[f"test_ppl_{key}"] = {k: v for k, v in r.items() if k != "window_nll"}
        report[f"test_window_nll_{key}"] = r["window_nll"][:64]
        log(f"test perplexity ({key} transformers): {r['ppl']:.4f} over {r['scored']} tokens, {r['windows']} windows")
        if dt == torch.float32:
            report["expert_load"] = expert_load(m, splits["test"])
            report["samples"] = []
            for q in ("What does the word \"harbor\" mean?", "What is a dog?", "Define happiness.",
                      "What does Genesis 1:1 say?", "What is a compiler in computing?"):
                ids, out, text = greedy(m, tok, q)
                report["samples"].append({"question": q, "prompt_ids": ids, "greedy_ids": out, "text": text})
                log(f"Q: {q}\nA: {text!r}")
        del m
    with open(os.path.join(args.out, "report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
