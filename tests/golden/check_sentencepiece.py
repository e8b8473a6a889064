"""SentencePiece goldens from PyPI's `sentencepiece` package (the Python side of the same library
Debian's libsentencepiece is), for `mltrain data tokenize --sentencepiece / --train-sentencepiece`.

  python check_sentencepiece.py check OUT_DIR [--ties]
      re-encodes meta.json's sources line by line with OUT_DIR/tokenizer.model, each line ending
      in EOS, split where meta.json's train_bytes says, and compares with train.bin and val.bin
      (their dtype from meta.json); checks vocab_size, bos/eos ids and the SHA-256. --ties: a line
      whose ids differ passes when both segmentations decode to the same text with the same total
      piece score (a unigram tie, which libsentencepiece 0.1.97 and 0.2.x break differently);
      they are counted.
  python check_sentencepiece.py train PREFIX VOCAB TYPE FILE...
      trains a model with the Python package (PREFIX.model).
  python check_sentencepiece.py big OUT.model N
      writes a unigram model of N pieces (more than uint16 holds when N > 65,536), built as a
      ModelProto: <unk>, <s>, </s>, the letters, and pieces "▁w<i>".

check prints one JSON line and exits 1 naming every difference.
"""
import hashlib
import json
import pathlib
import sys

import numpy as np
import sentencepiece as spm

from golden_report import finish


def check(out, allow_ties=False):
    out = pathlib.Path(out)
    meta = json.loads((out / "meta.json").read_text())
    model = out / meta["tokenizer_file"]
    sp = spm.SentencePieceProcessor(model_file=str(model))
    problems = []
    if meta["vocab_size"] != sp.get_piece_size():
        problems.append(f"vocab_size {meta['vocab_size']}, the model has {sp.get_piece_size()}")
    if (meta["bos_id"], meta["eos_id"]) != (sp.bos_id(), sp.eos_id()):
        problems.append(f"bos/eos {meta['bos_id']}/{meta['eos_id']}, the model's {sp.bos_id()}/{sp.eos_id()}")
    if meta["tokenizer_sha256"] != hashlib.sha256(model.read_bytes()).hexdigest():
        problems.append("tokenizer_sha256 is not the model file's")
    lines = []
    for f in meta["sources"]:
        text = pathlib.Path(f).read_bytes().decode("utf-8")
        parts = text.split("\n")
        if parts and parts[-1] == "":
            parts.pop()
        lines += parts
    dtype = {"uint16": np.uint16, "uint32": np.uint32}[meta["dtype"]]
    train = np.fromfile(out / "train.bin", dtype=dtype).astype(np.int64)
    val = np.fromfile(out / "val.bin", dtype=dtype).astype(np.int64)
    ours = np.concatenate([train, val])
    # Line by line: ours up to each EOS against Python's encoding of that line.
    ends = np.nonzero(ours == sp.eos_id())[0]
    if len(ends) != len(lines):
        problems.append(f"{len(ends)} lines (EOS ids) in the token files, {len(lines)} in the text")
    want, ties, seen, split, start = [], 0, 0, None, 0
    for i, line in enumerate(lines[:len(ends)]):
        if seen == meta["train_bytes"] and split is None:
            split = start
        py = sp.encode(line)
        mine = [int(x) for x in ours[start:ends[i]]]
        if mine != py:
            score = lambda ids: sum(sp.get_score(x) for x in ids)
            tie = sp.decode(mine) == sp.decode(py) and abs(score(mine) - score(py)) < 1e-4
            if tie and allow_ties:
                ties += 1
            else:
                problems.append(f"line {i + 1}: ours {mine[:12]} Python {py[:12]}"
                                + (" (an equal-score tie)" if tie else ""))
        want += py + [sp.eos_id()]
        seen += len(line.encode("utf-8")) + 1
        start = ends[i] + 1
    if split is None:
        split = start
    if len(train) != split:
        problems.append(f"train.bin has {len(train)} ids; its lines end at {split}")
    want = np.array(want, dtype=np.int64)
    if meta["dtype"] == "uint16" and sp.get_piece_size() > 65536:
        problems.append("uint16 for a vocabulary past 65,536")
    return finish({"ids": int(len(ours)), "train": int(len(train)), "val": int(len(val)),
                   "lines": len(lines), "tie_lines": ties, "vocab": sp.get_piece_size(),
                   "max_id": int(want.max()), "dtype": meta["dtype"],
                   "sentencepiece": spm.__version__}, problems)


def train(prefix, vocab, model_type, files):
    spm.SentencePieceTrainer.train(input=",".join(files), model_prefix=prefix, vocab_size=int(vocab),
                                   model_type=model_type, character_coverage=1.0, num_threads=2,
                                   minloglevel=2)
    return 0


def big(path, n):
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    m.trainer_spec.vocab_size = int(n)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = True
    m.normalizer_spec.escape_whitespaces = True
    for piece, kind in (("<unk>", pb.ModelProto.SentencePiece.UNKNOWN),
                        ("<s>", pb.ModelProto.SentencePiece.CONTROL),
                        ("</s>", pb.ModelProto.SentencePiece.CONTROL)):
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, 0.0, kind
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + ["▁"]
    for c in letters:
        p = m.pieces.add()
        p.piece, p.score = c, -10.0
    i = 0
    while len(m.pieces) < int(n):
        p = m.pieces.add()
        p.piece, p.score = f"▁w{i}", -1.0
        i += 1
    pathlib.Path(path).write_bytes(m.SerializeToString())
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "check":
        sys.exit(check(sys.argv[2], "--ties" in sys.argv[3:]))
    if cmd == "train":
        sys.exit(train(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
    if cmd == "big":
        sys.exit(big(sys.argv[2], sys.argv[3]))
    sys.exit(f"unknown command {cmd}")
