"""fusekit's synthetic masked-LM batches in Python, as models/mlm_data.h specifies them.

The Python peers train on the same batches as the C++ variants: either read the safetensors file
that `write_mlm_batches` writes (read_batches), or generate them here (make_mlm_batch), which gives
the same numbers. `python3 mlm_data.py --check FILE` regenerates every batch of such a file from the
options in its metadata and exits non-zero on any difference (a CPU test runs it).
Plain Python, no third-party packages.
"""
import json
import struct
import sys

MASK64 = (1 << 64) - 1
PAD, CLS, SEP, MASK, IGNORE = 0, 101, 102, 103, -100


class SplitMix64:
    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def unit(self):
        return (self.next() >> 11) * 2.0**-53


def make_mlm_batch(batch, sequence, index, seed=0, vocab=30522, min_length=0, max_length=0, first_word=999,
                   mask_probability=0.15, echo=False):
    """Batch `index` of the stream: dict of input_ids, token_type_ids, labels ([batch][sequence]) and lengths."""
    min_length = min_length or max(3, sequence // 2)
    max_length = max_length or sequence
    random = SplitMix64(seed ^ ((index * 0xD1B54A32D192ED03) & MASK64))
    word = lambda: first_word + random.below(vocab - first_word)
    out = {"input_ids": [], "token_type_ids": [], "labels": [], "lengths": []}
    for _ in range(batch):
        length = min_length + random.below(max_length - min_length + 1)
        ids, types, labels = [PAD] * sequence, [0] * sequence, [IGNORE] * sequence
        ids[0], ids[length - 1] = CLS, SEP
        if length >= 5:
            a = 1 + random.below(length - 4)
            ids[a + 1] = SEP
            for s in range(a + 2, length):
                types[s] = 1
        words, first_words = [], 0
        for s in range(1, length - 1):
            if ids[s] == SEP:
                first_words = s - 1
                continue
            if echo and length >= 5 and first_words > 0:  # the second segment repeats the first
                ids[s] = ids[1 + (s - first_words - 2) % first_words]
            else:
                ids[s] = word()
            words.append(s)
        n = min(max(1, round(len(words) * mask_probability)), len(words))  # round: ties to even, as C++
        for i in range(n):
            j = i + random.below(len(words) - i)
            words[i], words[j] = words[j], words[i]
        for s in words[:n]:
            labels[s] = ids[s]
            u = random.unit()
            if u < 0.8:
                ids[s] = MASK
            elif u < 0.9:
                ids[s] = word()
        for key, value in (("input_ids", ids), ("token_type_ids", types), ("labels", labels)):
            out[key].append(value)
        out["lengths"].append(length)
    return out


def read_batches(path):
    """The batches of a file written by write_mlm_batches: (metadata, {index: batch dict})."""
    with open(path, "rb") as f:
        data = f.read()
    (header_bytes,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_bytes])
    metadata = header.pop("__metadata__", {})
    base = 8 + header_bytes
    batches = {}
    for name, entry in header.items():
        assert entry["dtype"] == "I64", name
        begin, end = entry["data_offsets"]
        values = list(struct.unpack_from("<%dq" % ((end - begin) // 8), data, base + begin))
        index, field = name.split(".", 1)
        shape = entry["shape"]
        if len(shape) == 2:
            values = [values[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]
        batches.setdefault(int(index), {})[field] = values
    return metadata, batches


def check(path):
    metadata, batches = read_batches(path)
    options = {key: int(metadata[key]) for key in ("vocab", "min_length", "max_length", "first_word", "seed")}
    options["mask_probability"] = float(metadata["mask_probability"])
    options["echo"] = metadata.get("echo", "0") == "1"
    bad = 0
    for index, batch in sorted(batches.items()):
        expected = make_mlm_batch(int(metadata["batch"]), int(metadata["sequence"]), index, **options)
        for field, values in batch.items():
            if values != expected[field]:
                print("batch %d: %s differs from the Python generator" % (index, field))
                bad += 1
    print("mlm_data check: %d batches, %d differences" % (len(batches), bad))
    return bad == 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--check":
        print("usage: mlm_data.py --check FILE.safetensors", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if check(sys.argv[2]) else 1)
