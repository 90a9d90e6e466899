"""Train the tiny default model that rt ships in ``rt/assets/default_model``.

A small Llama-architecture causal LM with its own byte-level BPE tokenizer,
trained on the King James Version of the Bible (public domain) as packaged
by Debian (``apt-get install bible-kjv-text bible-kjv``). The result is saved
in Hugging Face format, so ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load it with no network.

The corpus argument is either Debian's compressed ``/usr/lib/bible.data``
(decoded with the ``bible`` command from the ``bible-kjv`` package) or a plain
text file with one ``<Book><chapter>:<verse> <text>`` verse per line, which is
what ``bible -f Gen1:1-Rev22:21`` prints.

Given the seed, the run is deterministic apart from floating-point reduction
order; ``--time-budget`` only cuts a run short (and says so), it never changes
the learning-rate schedule.

Example (the command that produced the shipped model is in its README.md)::

    .venv/bin/python tools/train_tiny_model.py --steps 3000 --out rt/assets/default_model
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

DEBIAN_CORPUS = Path("/usr/lib/bible.data")
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "rt" / "assets" / "default_model"
DEFAULT_WORDS = REPO_ROOT / "tests" / "data" / "kjv_words.txt"

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
CHAT_ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = [BOS, EOS, PAD, *(f"<|{role}|>" for role in CHAT_ROLES)]

# <|end|> closes both a document and a chat turn, so one eos id stops generation.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant, got ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

VERSE_RE = re.compile(r"^(?P<book>[1-3]?[A-Za-z]+)(?P<chapter>\d+):(?P<verse>\d+)\s+(?P<text>.*)$")
WORD_RE = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Chapter:
    ref: str  # e.g. "Ge1"
    verses: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.verses)


def read_corpus(path: Path) -> str:
    """Verse-per-line text, decoding Debian's compressed bible.data if given it."""
    head = path.read_bytes()[:256]
    if b"\0" not in head and VERSE_RE.match(head.decode("utf-8", "replace").split("\n")[0]):
        return path.read_text(encoding="utf-8")
    bible = shutil.which("bible")
    if bible is None:
        raise SystemExit(f"{path} is compressed; decoding it needs `apt-get install bible-kjv`")
    cmd = [bible, "-f", "-p", str(path.parent), "-d", path.name, "Gen1:1-Rev22:21"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def parse_chapters(raw: str) -> list[Chapter]:
    """Strip verse references and group verses into chapters of running prose."""
    chapters: list[Chapter] = []
    ref, verses = "", list[str]()
    for line in raw.splitlines():
        match = VERSE_RE.match(line.strip())
        if match is None:
            continue
        this_ref = match["book"] + match["chapter"]
        if this_ref != ref and verses:
            chapters.append(Chapter(ref, tuple(verses)))
            verses = []
        ref = this_ref
        text = re.sub(r"\s+", " ", match["text"]).strip()
        if text:
            verses.append(text)
    if verses:
        chapters.append(Chapter(ref, tuple(verses)))
    if len(chapters) < 100:
        raise SystemExit(f"expected ~1189 chapters of verse-per-line text, parsed {len(chapters)}")
    return chapters


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Plain encodes start with <|bos|>, as in training (Llama 3 convention).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """Documents already carry their special tokens; concatenate their ids."""
    # The backend tokenizer skips the model_max_length check: chapters run past 512 tokens.
    encodings = tokenizer.backend_tokenizer.encode_batch(docs, add_special_tokens=False)
    return torch.tensor([i for enc in encodings for i in enc.ids], dtype=torch.long)


def build_documents(
    chapters: list[Chapter], tokenizer: PreTrainedTokenizerFast, chat_pairs: int, rng: random.Random
) -> list[str]:
    """Chapters as prose, plus a few verse-follows-verse chat exchanges."""
    docs = [f"{BOS}{chapter.text}{EOS}" for chapter in chapters]
    pairs = [(c.verses[i], c.verses[i + 1]) for c in chapters for i in range(len(c.verses) - 1)]
    for user, assistant in rng.sample(pairs, min(chat_pairs, len(pairs))):
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        docs.append(str(tokenizer.apply_chat_template(messages, tokenize=False)))
    rng.shuffle(docs)
    return docs


def set_portable_tokenizer_class(config_path: Path) -> None:
    """Name the class every transformers release knows, not v5's TokenizersBackend."""
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def lr_at(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def sample_batch(
    stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch,), generator=gen)
    window = torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]  # [batch, seq_len] each


@torch.no_grad()
def eval_loss(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int, batch: int) -> float:
    """Mean loss over consecutive non-overlapping windows of the held-out stream."""
    model.eval()
    usable = (stream.numel() - 1) // seq_len * seq_len
    inputs = stream[:usable].view(-1, seq_len)
    targets = stream[1 : usable + 1].view(-1, seq_len)
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch):
        logits = model(input_ids=inputs[i : i + batch]).logits
        total += F.cross_entropy(
            logits.flatten(0, 1), targets[i : i + batch].flatten(), reduction="sum"
        ).item()
        count += targets[i : i + batch].numel()
    model.train()
    return total / count


def write_word_list(chapters: list[Chapter], path: Path) -> int:
    words = sorted({w for c in chapters for w in WORD_RE.findall(c.text.lower())})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return len(words)


def build_config(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def train(
    model: LlamaForCausalLM,
    train_stream: torch.Tensor,
    val_stream: torch.Tensor,
    args: argparse.Namespace,
) -> list[dict[str, float]]:
    """AdamW, linear warmup then cosine decay; returns the evaluation history."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    history: list[dict[str, float]] = []
    started = time.monotonic()
    smoothed = float("nan")
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        inputs, targets = sample_batch(train_stream, args.batch, args.seq_len, gen)
        logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smoothed = loss.item() if math.isnan(smoothed) else 0.95 * smoothed + 0.05 * loss.item()
        elapsed = time.monotonic() - started
        out_of_time = elapsed > args.time_budget
        if (step + 1) % args.eval_interval == 0 or step + 1 == args.steps or out_of_time:
            val = eval_loss(model, val_stream, args.seq_len, 32)
            history.append(
                {"step": step + 1, "train_loss": smoothed, "val_loss": val, "s": elapsed}
            )
            print(
                f"step {step + 1}/{args.steps} train {smoothed:.3f} val {val:.3f} "
                f"{(step + 1) / elapsed:.2f} steps/s {elapsed:.0f}s",
                flush=True,
            )
        if out_of_time:
            print(f"time budget of {args.time_budget:.0f}s spent: stopped at step {step + 1}")
            break
    return history


def save(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    history: list[dict[str, float]],
    args: argparse.Namespace,
) -> None:
    dtype = getattr(torch, args.dtype)
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)
    set_portable_tokenizer_class(args.out / "tokenizer_config.json")
    log = {"args": {k: str(v) for k, v in vars(args).items()}, "history": history}
    (args.out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    for path in args.out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; package data must be world-readable


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", type=Path, default=DEBIAN_CORPUS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--word-list", type=Path, default=DEFAULT_WORDS)
    p.add_argument("--seed", type=int, default=1611)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--time-budget", type=float, default=1800.0, help="seconds; stops early")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--chat-pairs", type=int, default=3000, help="verse-pair chat examples")
    p.add_argument("--val-every-nth-chapter", type=int, default=40)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    chapters = parse_chapters(read_corpus(args.corpus))
    n = args.val_every_nth_chapter
    val_chapters = chapters[::n]
    train_chapters = [c for i, c in enumerate(chapters) if i % n]
    print(f"{len(chapters)} chapters: {len(train_chapters)} train, {len(val_chapters)} val")
    print(f"word list: {write_word_list(chapters, args.word_list)} words -> {args.word_list}")

    tokenizer = train_tokenizer([c.text for c in train_chapters], args.vocab_size)
    train_stream = encode_stream(
        tokenizer, build_documents(train_chapters, tokenizer, args.chat_pairs, rng)
    )
    val_stream = encode_stream(tokenizer, [f"{BOS}{c.text}{EOS}" for c in val_chapters])
    print(f"vocab {len(tokenizer)}; tokens: {train_stream.numel()} train, {val_stream.numel()} val")

    model = LlamaForCausalLM(build_config(args, tokenizer))
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    history = train(model, train_stream, val_stream, args)
    save(model, tokenizer, history, args)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
