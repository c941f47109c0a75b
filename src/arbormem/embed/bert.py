"""A direct loader for sentence-transformers BERT models with mean pooling (the bundled
all-MiniLM-L6-v2): the same vectors as ``SentenceTransformer(path).encode(...,
normalize_embeddings=True)`` from torch, ``tokenizers`` and ``safetensors`` alone.

Why: importing ``sentence_transformers`` costs about 5 s on a 2-core machine (it pulls in
transformers' model registry, scikit-learn, scipy and torch.distributed), four times the model
load itself; a server's first write waited for all of it. This module imports torch and two
small Rust-backed packages and runs the 6-layer encoder with torch's own layers. A model
folder it does not recognise (another architecture, another pooling) is left to
sentence-transformers (``SentenceTransformerEncoder``). ``tests/core/test_local_model.py``
checks the vectors against sentence-transformers'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def supported(path: Path) -> bool:
    """True for a sentence-transformers folder this loader reproduces exactly: a BERT
    transformer with absolute positions, mean pooling, then (optionally) normalisation."""
    try:
        modules = json.loads((path / "modules.json").read_text("utf-8"))
        config = json.loads((path / "config.json").read_text("utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        pooling = json.loads((path / pooling_dir / "config.json").read_text("utf-8"))
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return False
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens")
    return (kinds[:2] == ["Transformer", "Pooling"] and kinds[2:] in ([], ["Normalize"])
            and config.get("model_type") == "bert" and config.get("hidden_act") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
            and bool(mean_only))


class BertEncoder:
    """Mean-pooled, L2-normalised BERT sentence vectors (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        config = json.loads((path / "config.json").read_text("utf-8"))
        st_config = path / "sentence_bert_config.json"
        max_len = json.loads(st_config.read_text("utf-8")).get("max_seq_length", 256) if st_config.is_file() else 256
        self.max_len = min(int(max_len), int(config["max_position_embeddings"]))
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_len)
        self.tokenizer.no_padding()
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        self.w = {k.removeprefix("bert."): v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
        self.dim = int(config["hidden_size"])
        self.torch = torch

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> Any:
        """Unit vectors, one row per text (float32 numpy). Batches are sorted by length, as
        sentence-transformers does, so padding stays short."""
        import numpy as np

        torch = self.torch
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                enc = self.tokenizer.encode_batch([texts[i] for i in idx])
                width = max(len(e.ids) for e in enc)
                ids = torch.zeros((len(idx), width), dtype=torch.long)
                types = torch.zeros((len(idx), width), dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.float32)
                for row, e in enumerate(enc):
                    n = len(e.ids)
                    ids[row, :n] = torch.tensor(e.ids)
                    types[row, :n] = torch.tensor(e.type_ids)
                    mask[row, :n] = 1.0
                hidden = self._forward(ids, types, mask)
                pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.numpy()
        return out

    def _forward(self, ids: Any, types: Any, mask: Any) -> Any:
        torch, w, F = self.torch, self.w, self.torch.nn.functional
        positions = torch.arange(ids.shape[1])[None, :]
        x = (F.embedding(ids, w["embeddings.word_embeddings.weight"])
             + F.embedding(positions, w["embeddings.position_embeddings.weight"])
             + F.embedding(types, w["embeddings.token_type_embeddings.weight"]))
        x = self._norm(x, "embeddings.LayerNorm")
        batch, width, hidden = x.shape
        head = hidden // self.heads
        # Padding keys get the most negative float, as transformers' BERT does.
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def split(t: Any) -> Any:
                return t.view(batch, width, self.heads, head).transpose(1, 2)

            q = split(F.linear(x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"]))
            k = split(F.linear(x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"]))
            v = split(F.linear(x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"]))
            scores = q @ k.transpose(-1, -2) / math.sqrt(head) + bias
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, width, hidden)
            att = F.linear(ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
            x = self._norm(att + x, p + "attention.output.LayerNorm")
            mid = F.gelu(F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
            out = F.linear(mid, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
            x = self._norm(out + x, p + "output.LayerNorm")
        return x

    def _norm(self, x: Any, name: str) -> Any:
        return self.torch.nn.functional.layer_norm(
            x, (x.shape[-1],), self.w[name + ".weight"], self.w[name + ".bias"], self.eps)


__all__ = ["BertEncoder", "supported"]
