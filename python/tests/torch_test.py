"""pscluster.torch against plain PyTorch, through 2 real ps_server processes: a small model
trained with DistributedOptimizer (SGD on the servers; gradients pushed during backward, or all
in step()) follows torch.optim.SGD step for step, Embedding and EmbeddingBag follow
torch.nn.Embedding(Bag) with SGD, and misuse is refused with a clear error."""
import copy
import unittest

import numpy as np
import torch

import pscluster
import pscluster.torch as pst
from local_cluster import LocalServers

SERVERS = None


def setUpModule():
    global SERVERS
    SERVERS = LocalServers(n=2).__enter__()


def tearDownModule():
    SERVERS.__exit__(None, None, None)


def connect(job):
    return pscluster.connect(servers=SERVERS.addresses, job_id=job)


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


class DistributedOptimizerTest(unittest.TestCase):
    def follow_sgd(self, job, overlap):
        model = tiny_model()
        client = connect(job)
        opt = pst.DistributedOptimizer(model, client, optimizer=pscluster.Optimizer("sgd", 0.1),
                                       overlap=overlap)
        # The servers drew their own initial values (init_like): start the reference from them.
        ref = copy.deepcopy(model)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for step in range(5):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
                o.step()
            self.assertEqual(client.step, step + 1)
            for (n, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=n)
        self.assertGreaterEqual(client.stats()["calls"], 5)
        client._model = model
        return client

    def test_overlapped_pushes_follow_sgd(self):
        self.follow_sgd("opt-overlap", overlap=True)

    def test_pushes_in_step_follow_sgd(self):
        self.follow_sgd("opt-step", overlap=False)

    def test_second_worker_starts_from_the_servers(self):
        first = self.follow_sgd("opt-shared", overlap=True)
        trained = [p.detach().clone() for p in first._model.parameters()]
        other = tiny_model()  # built the same way: the same table specs
        fresh = [p.detach().clone() for p in other.parameters()]
        client = connect("opt-shared")
        client.step = 5
        pst.DistributedOptimizer(other, client, optimizer=pscluster.Optimizer("sgd", 0.1))
        for p, t, f in zip(other.parameters(), trained, fresh):
            torch.testing.assert_close(p.detach(), t)
            self.assertFalse(torch.equal(p.detach(), f))
        # Built differently (other initial values): refused by the servers, naming the table.
        zeros = tiny_model()
        with torch.no_grad():
            for p in zeros.parameters():
                p.zero_()
        with self.assertRaises(pscluster.Error) as e:
            pst.DistributedOptimizer(zeros, connect("opt-shared"),
                                     optimizer=pscluster.Optimizer("sgd", 0.1))
        self.assertEqual(e.exception.code, "ALREADY_EXISTS")
        self.assertIn("0.weight", e.exception.message)

    def test_two_backward_passes_need_overlap_false(self):
        model = tiny_model()
        opt = pst.DistributedOptimizer(model, connect("opt-twice"),
                                       optimizer=pscluster.Optimizer("sgd", 0.1))
        model(torch.randn(2, 6)).sum().backward()
        with self.assertRaisesRegex(RuntimeError, "overlap=False"):
            model(torch.randn(2, 6)).sum().backward()

    def test_refused(self):
        with self.assertRaisesRegex(ValueError, "give optimizer="):
            pst.DistributedOptimizer(tiny_model(), connect("opt-none"))
        with self.assertRaisesRegex(TypeError, "float32"):
            pst.DistributedOptimizer(tiny_model().double(), connect("opt-double"),
                                     optimizer=pscluster.Optimizer("sgd", 0.1))


class EmbeddingTest(unittest.TestCase):
    def test_embedding_follows_torch(self):
        client = connect("emb")
        emb = pst.Embedding(100, 4, client, "emb", optimizer=pscluster.Optimizer("sgd", 0.5),
                            init=pscluster.Init("uniform", low=-1, high=1, seed=2))
        head = torch.nn.Linear(4, 1)
        model = torch.nn.ModuleDict({"emb": emb, "head": head})
        opt = pst.DistributedOptimizer(model, client, optimizer=pscluster.Optimizer("sgd", 0.5))
        # The reference: a torch.nn.Embedding holding the servers' rows of the keys used.
        keys = torch.tensor([[3, 7, 3], [99, 7, 0]])
        rows = torch.empty(100, 4)
        client.pull(client.step, sparse={"emb": (torch.arange(100), rows)})
        ref_emb = torch.nn.Embedding(100, 4)
        with torch.no_grad():
            ref_emb.weight.copy_(rows)
        ref_head = copy.deepcopy(head)
        ref_opt = torch.optim.SGD(list(ref_emb.parameters()) + list(ref_head.parameters()), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            ref_opt.zero_grad()
            head(emb(keys)).square().sum().backward()
            ref_head(ref_emb(keys)).square().sum().backward()
            opt.step()
            ref_opt.step()
        client.pull(client.step, sparse={"emb": (torch.arange(100), rows)})
        torch.testing.assert_close(rows, ref_emb.weight.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(head.weight.detach(), ref_head.weight.detach())
        with self.assertRaisesRegex(ValueError, "not below num_embeddings 100"):
            emb(torch.tensor([100]))
        with self.assertRaisesRegex(TypeError, "int64"):
            emb(torch.tensor([1.0]))

    def test_embedding_bag_follows_torch(self):
        client = connect("bag")
        bag = pst.EmbeddingBag(None, 3, client, "bag", mode="sum",
                               optimizer=pscluster.Optimizer("sgd", 0.25),
                               init=pscluster.Init("normal", stddev=0.5, seed=4))
        lin = torch.nn.Linear(3, 1)
        model = torch.nn.ModuleDict({"bag": bag, "lin": lin})
        opt = pst.DistributedOptimizer(model, client, optimizer=pscluster.Optimizer("sgd", 0.25))
        big = 1 << 50
        keys = torch.tensor([5, big, 5, 9, big], dtype=torch.int64)
        offsets = torch.tensor([0, 2])
        uniq = torch.tensor([5, 9, big])
        start = torch.empty(3, 3)
        client.pull(client.step, sparse={"bag": (uniq, start)})
        ref = torch.nn.EmbeddingBag(3, 3, mode="sum")
        with torch.no_grad():
            ref.weight.copy_(start)
        ref_lin = copy.deepcopy(lin)
        ref_opt = torch.optim.SGD(list(ref.parameters()) + list(ref_lin.parameters()), lr=0.25)
        ref_keys = torch.tensor([0, 2, 0, 1, 2])  # positions in uniq
        for _ in range(2):
            opt.zero_grad()
            ref_opt.zero_grad()
            lin(bag(keys, offsets)).square().sum().backward()
            ref_lin(ref(ref_keys, offsets)).square().sum().backward()
            opt.step()
            ref_opt.step()
        now = torch.empty(3, 3)
        client.pull(client.step, sparse={"bag": (uniq, now)})
        torch.testing.assert_close(now, ref.weight.detach(), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    unittest.main(verbosity=2)
