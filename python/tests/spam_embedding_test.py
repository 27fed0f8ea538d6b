"""A text classifier with pscluster.torch.EmbeddingBag on the SpamAssassin corpus (installed by
deploy/install_deps.sh), through 2 real ps_server processes: the bag of each e-mail's hashed
words and word bigrams (a sparse table of 2^20 rows, Adam on the servers) feeds a linear
head (a dense table, Adam, through DistributedOptimizer); forward pulls only the batch's unique
keys, backward pushes their gradient rows. Held-out accuracy (a fixed 20% of the e-mails, by a
hash of the file name) must reach 0.97. Usage: spam_embedding_test.py [DATA_DIR]."""
import hashlib
import json
import os
import re
import sys

import numpy as np
import torch

import pscluster
import pscluster.torch as pst
from local_cluster import LocalServers

DATA_DIR = sys.argv[1] if len(sys.argv) > 1 else "/usr/local/share/pscluster/spam-assassin/data"
BUCKETS = 1 << 20
WORD = re.compile(rb"[a-z0-9]{2,40}")


def h(token):
    return int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "little") % BUCKETS


def featurize(raw):
    head, _, body = raw.partition(b"\n\n")
    subject = re.search(rb"^subject:(.*)$", head.lower(), re.M)
    words = WORD.findall((subject.group(1) if subject else b"") + b" " + body.lower())
    keys = {h(w) for w in words} | {h(a + b" " + b) for a, b in zip(words, words[1:])}
    return np.fromiter(sorted(keys), np.int64) if keys else np.zeros(1, np.int64)


def load():
    with open(os.path.join(DATA_DIR, "file_list.json")) as f:
        files = json.load(f)
    train, test = [], []
    for name in files:
        with open(os.path.join(DATA_DIR, name), "rb") as f:
            ex = (featurize(f.read()), 1 if name.startswith("spam") else 0)
        held_out = hashlib.md5(name.encode()).digest()[0] % 5 == 0
        (test if held_out else train).append(ex)
    return train, test


def batches(examples, size, rng=None):
    order = rng.permutation(len(examples)) if rng is not None else np.arange(len(examples))
    for i in range(0, len(order), size):
        chunk = [examples[j] for j in order[i:i + size]]
        keys = [k for k, _ in chunk]
        offsets = np.cumsum([0] + [len(k) for k in keys[:-1]])
        yield (torch.from_numpy(np.concatenate(keys)), torch.from_numpy(offsets),
               torch.tensor([y for _, y in chunk]))


class Classifier(torch.nn.Module):
    def __init__(self, client):
        super().__init__()
        self.bag = pst.EmbeddingBag(BUCKETS, 32, client, "words", mode="mean",
                                    optimizer=pscluster.Optimizer("adam", 0.01),
                                    init=pscluster.Init("normal", stddev=0.1, seed=7))
        self.head = torch.nn.Linear(32, 2)

    def forward(self, keys, offsets):
        return self.head(torch.relu(self.bag(keys, offsets)))


def main():
    if not os.path.exists(os.path.join(DATA_DIR, "file_list.json")):
        raise SystemExit(f"SpamAssassin corpus missing in {DATA_DIR}: run deploy/install_deps.sh")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, test = load()
    print(f"spam_embedding_test: {len(train)} training e-mails, {len(test)} held out")
    with LocalServers(n=2) as servers:
        client = pscluster.connect(servers=servers.addresses, job_id="spam-bag")
        model = Classifier(client)  # declares the sparse table before the optimizer creates all
        opt = pst.DistributedOptimizer(model, client, optimizer=pscluster.Optimizer("adam", 0.01))
        rng = np.random.default_rng(0)
        loss_fn = torch.nn.CrossEntropyLoss()
        for epoch in range(2):
            total, n = 0.0, 0
            for keys, offsets, y in batches(train, 32, rng):
                opt.zero_grad()
                loss = loss_fn(model(keys, offsets), y)
                loss.backward()
                opt.step()
                total, n = total + float(loss), n + 1
            model.eval()
            correct = 0
            with torch.no_grad():
                for keys, offsets, y in batches(test, 500):
                    correct += int((model(keys, offsets).argmax(1) == y).sum())
            model.train()
            acc = correct / len(test)
            print(f"epoch {epoch}: train loss {total / n:.4f}, held-out accuracy {acc:.4f}")
        statuses = client.server_statuses()
        client.close()
    assert acc >= 0.97, f"held-out accuracy {acc:.4f} < 0.97"
    assert len(statuses) == 2
    print(f"spam_embedding_test: held-out accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
