#!/usr/bin/env python3
"""The Helm chart rendered (render.py, helm's template language; no helm binary needed) with its
defaults and with TLS, tokens, shared volumes and extra flags on: the objects are well-formed
Kubernetes objects, every volume a container mounts exists, every flag passed to a daemon is one
the binary has (its --helpfull), and each value ends up where it should.

Usage: chart_test.py CHART_DIR BIN_DIR"""
import re
import subprocess
import sys
import unittest

import yaml

sys.path.insert(0, sys.argv[1] + "/..")
import render  # noqa: E402

CHART, BINS = sys.argv[1], sys.argv[2]
BINARY = {"ps_scheduler": "scheduler/ps_scheduler", "ps_server": "server/ps_server",
          "ps_worker": "worker/ps_worker"}
_flags = {}


def flags_of(command):
    if command not in _flags:
        r = subprocess.run([f"{BINS}/{BINARY[command]}", "--helpfull"], capture_output=True,
                           text=True)
        _flags[command] = set(re.findall(r"^\s+--([a-z0-9_]+) \(", r.stdout + r.stderr, re.M))
    return _flags[command]


def objects(overrides=None):
    out = []
    for name, text in render.render_chart(CHART, overrides).items():
        if name.endswith(".txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def by_kind(objs, kind, component):
    found = [o for o in objs if o["kind"] == kind and
             o["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"{kind}/{component}: {len(found)} objects"
    return found[0]


def container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


def args_of(obj):
    return dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in container(obj)["args"])


class ChartTest(unittest.TestCase):
    def check_common(self, objs):
        for o in objs:
            self.assertIn(o["kind"], {"Deployment", "StatefulSet", "Service",
                                      "PersistentVolumeClaim"})
            self.assertTrue(o["metadata"]["name"].startswith("ps-pscluster"), o["metadata"])
            self.assertEqual(o["metadata"]["labels"]["app.kubernetes.io/part-of"], "pscluster")
        for o in objs:
            if o["kind"] not in ("Deployment", "StatefulSet"):
                continue
            spec = o["spec"]["template"]["spec"]
            volumes = {v["name"] for v in spec.get("volumes") or []}
            volumes |= {t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates") or []}
            c = container(o)
            for m in c.get("volumeMounts") or []:
                self.assertIn(m["name"], volumes, f"{o['metadata']['name']} mounts {m['name']}")
            for a in c["args"]:
                self.assertTrue(a.startswith("--"), a)
                flag = a[2:].split("=", 1)[0]
                self.assertIn(flag, flags_of(c["command"][0]), f"{c['command'][0]} {a}")
            self.assertEqual(o["spec"]["selector"]["matchLabels"].items() <=
                             o["spec"]["template"]["metadata"]["labels"].items(), True)

    def test_defaults(self):
        objs = objects()
        self.check_common(objs)
        sched = by_kind(objs, "Deployment", "scheduler")
        a = args_of(sched)
        self.assertEqual(a["http_listen"], "0.0.0.0:8080")
        self.assertNotIn("tls_cert", a)
        self.assertNotIn("token_file", a)
        self.assertIn("grpc", container(sched)["livenessProbe"])
        svc = by_kind(objs, "Service", "scheduler")
        self.assertIn("http", [p["name"] for p in svc["spec"]["ports"]])
        servers = by_kind(objs, "StatefulSet", "server")
        self.assertEqual(servers["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"],
                         ["ReadWriteOnce"])
        self.assertEqual([o for o in objs if o["kind"] == "PersistentVolumeClaim" and
                          o["metadata"]["labels"]["app.kubernetes.io/component"] == "storage"], [])
        workers = by_kind(objs, "Deployment", "worker")
        self.assertEqual(container(workers)["image"], "pscluster-gpu:0.1.0")

    def test_quotas_from_the_auth_secret_reach_the_scheduler_only(self):
        objs = objects({"auth": {"enabled": True, "secretName": "my-auth", "quotas": True}})
        self.check_common(objs)
        sched = by_kind(objs, "Deployment", "scheduler")
        self.assertEqual(args_of(sched)["quota_file"], "/etc/pscluster/auth/quotas")
        vols = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual([i["key"] for i in vols["auth"]["secret"]["items"]],
                         ["tokens", "scheduler.token", "quotas"])
        for kind, component in [("StatefulSet", "server"), ("Deployment", "worker")]:
            o = by_kind(objs, kind, component)
            self.assertNotIn("quota_file", args_of(o))
            vols = {v["name"]: v for v in o["spec"]["template"]["spec"]["volumes"]}
            self.assertNotIn("quotas", [i["key"] for i in vols["auth"]["secret"]["items"]])
        # Without auth there are no identities, so no quotas either.
        objs = objects({"auth": {"enabled": False, "quotas": True}})
        self.assertNotIn("quota_file", args_of(by_kind(objs, "Deployment", "scheduler")))

    def test_tls_tokens_shared_volumes_extra_flags(self):
        objs = objects({
            "tls": {"enabled": True, "secretName": "my-tls"},
            "auth": {"enabled": True, "secretName": "my-auth"},
            "storage": {"sharedCheckpoints": {"enabled": True, "storageClassName": "nfs"},
                        "exports": {"enabled": True}},
            "scheduler": {"extraArgs": ["--rebalance_every_ms=0"]},
            "servers": {"extraArgs": ["--data_threads=4"]},
            "workers": {"extraArgs": ["--cpu_threads=8"], "gpus": 0, "device": "cpu"},
        })
        self.check_common(objs)
        for kind, component, credential in [("Deployment", "scheduler", "scheduler"),
                                            ("StatefulSet", "server", "server"),
                                            ("Deployment", "worker", "worker")]:
            o = by_kind(objs, kind, component)
            a = args_of(o)
            self.assertEqual(a["tls_cert"], "/etc/pscluster/tls/tls.crt")
            self.assertEqual(a["tls_key"], "/etc/pscluster/tls/tls.key")
            self.assertEqual(a["tls_ca"], "/etc/pscluster/tls/ca.crt")
            self.assertEqual(a["token_file"], "/etc/pscluster/auth/tokens")
            self.assertEqual(a["credential_file"], f"/etc/pscluster/auth/{credential}.token")
            spec = o["spec"]["template"]["spec"]
            vols = {v["name"]: v for v in spec["volumes"]}
            self.assertEqual(vols["tls"]["secret"]["secretName"], "my-tls")
            self.assertEqual(vols["auth"]["secret"]["secretName"], "my-auth")
            # Each pod gets the token file and its own credential only, readable by its group.
            self.assertEqual([i["key"] for i in vols["auth"]["secret"]["items"]],
                             ["tokens", f"{credential}.token"])
            self.assertEqual(vols["auth"]["secret"]["defaultMode"], 0o440)
            self.assertNotIn("quota_file", a)  # auth.quotas is off.
            self.assertEqual(spec["securityContext"]["fsGroup"], 10001)
            mounts = {m["name"]: m for m in container(o)["volumeMounts"]}
            self.assertTrue(mounts["tls"]["readOnly"] and mounts["auth"]["readOnly"])
            # gRPC probes cannot speak TLS: TCP checks instead.
            self.assertIn("tcpSocket", container(o)["livenessProbe"])
            self.assertIn("tcpSocket", container(o)["readinessProbe"])
        sched = by_kind(objs, "Deployment", "scheduler")
        a = args_of(sched)
        self.assertEqual(a["rebalance_every_ms"], "0")
        self.assertEqual(a["http_listen"], "127.0.0.1:8080")  # Plain HTTP beside TLS: loopback.
        self.assertNotIn("http", [p["name"] for p in
                                  by_kind(objs, "Service", "scheduler")["spec"]["ports"]])
        servers = by_kind(objs, "StatefulSet", "server")
        self.assertEqual(args_of(servers)["data_threads"], "4")
        self.assertNotIn("volumeClaimTemplates", servers["spec"])

    def test_shared_volumes(self):
        objs = objects({"storage": {"sharedCheckpoints": {"enabled": True, "storageClassName": "nfs"},
                                    "exports": {"enabled": True}}})
        self.check_common(objs)
        pvcs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
        self.assertEqual(pvcs["ps-pscluster-checkpoints"]["spec"]["accessModes"], ["ReadWriteMany"])
        self.assertEqual(pvcs["ps-pscluster-checkpoints"]["spec"]["storageClassName"], "nfs")
        self.assertEqual(pvcs["ps-pscluster-exports"]["spec"]["accessModes"], ["ReadWriteMany"])
        claim_of = lambda o, name: next(v["persistentVolumeClaim"]["claimName"]  # noqa: E731
                                        for v in o["spec"]["template"]["spec"]["volumes"]
                                        if v["name"] == name)
        sched = by_kind(objs, "Deployment", "scheduler")
        servers = by_kind(objs, "StatefulSet", "server")
        workers = by_kind(objs, "Deployment", "worker")
        # The scheduler and every server see the same checkpoints at the same path.
        self.assertEqual(claim_of(sched, "checkpoints"), "ps-pscluster-checkpoints")
        self.assertEqual(claim_of(servers, "checkpoints"), "ps-pscluster-checkpoints")
        for o in (sched, servers):
            mounts = {m["name"]: m["mountPath"] for m in container(o)["volumeMounts"]}
            self.assertEqual(mounts["checkpoints"], "/var/lib/pscluster/checkpoints")
        self.assertEqual(args_of(servers)["checkpoint_dir"], "/var/lib/pscluster/checkpoints")
        for o in (servers, workers):
            self.assertEqual(claim_of(o, "exports"), "ps-pscluster-exports")
        # An existing claim is used, not created.
        objs = objects({"storage": {"sharedCheckpoints": {"enabled": True, "existingClaim": "nfs-ckpt"}}})
        self.assertEqual([o for o in objs if o["kind"] == "PersistentVolumeClaim" and
                          o["metadata"]["labels"]["app.kubernetes.io/component"] == "storage"], [])
        self.assertEqual(claim_of(by_kind(objs, "Deployment", "scheduler"), "checkpoints"), "nfs-ckpt")

    def test_several_schedulers_over_etcd(self):
        objs = objects({"scheduler": {"etcd": {"endpoints": "etcd-0.etcd:2379,etcd-1.etcd:2379",
                                               "leaseSeconds": 7},
                                      "replicas": 3}})
        self.check_common(objs)
        sched = by_kind(objs, "Deployment", "scheduler")
        self.assertEqual(sched["spec"]["replicas"], 3)
        self.assertNotIn("strategy", sched["spec"])  # Rolling updates: no database to hand over.
        a = args_of(sched)
        self.assertEqual(a["etcd_endpoints"], "etcd-0.etcd:2379,etcd-1.etcd:2379")
        self.assertEqual(a["etcd_prefix"], "/pscluster")
        self.assertEqual(a["etcd_lease_seconds"], "7")
        self.assertEqual(a["advertise_address"], "$(POD_IP):7070")
        self.assertNotIn("db", a)
        c = container(sched)
        self.assertEqual(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        # Followers are alive but not serving: TCP liveness, gRPC readiness (the leader is Ready).
        self.assertIn("tcpSocket", c["livenessProbe"])
        self.assertIn("grpc", c["readinessProbe"])
        volumes = sched["spec"]["template"]["spec"]["volumes"] or []
        self.assertNotIn("db", [v["name"] for v in volumes])
        self.assertEqual([o for o in objs if o["kind"] == "PersistentVolumeClaim" and
                          o["metadata"]["name"].endswith("scheduler-db")], [])
        peers = by_kind(objs, "Service", "scheduler-peers")
        self.assertEqual(peers["spec"]["clusterIP"], "None")
        self.assertTrue(peers["spec"]["publishNotReadyAddresses"])
        self.assertEqual(peers["spec"]["selector"]["app.kubernetes.io/component"], "scheduler")
        for kind, component in [("StatefulSet", "server"), ("Deployment", "worker")]:
            self.assertEqual(args_of(by_kind(objs, kind, component))["scheduler"],
                             "dns:///ps-pscluster-scheduler-peers:7070")
        # The default is one scheduler on its SQLite volume.
        objs = objects()
        sched = by_kind(objs, "Deployment", "scheduler")
        self.assertEqual(sched["spec"]["replicas"], 1)
        self.assertEqual(sched["spec"]["strategy"]["type"], "Recreate")
        self.assertNotIn("etcd_endpoints", args_of(sched))
        self.assertEqual([o for o in objs if o["kind"] == "Service" and
                          o["metadata"]["name"].endswith("peers")], [])
        self.assertEqual(args_of(by_kind(objs, "StatefulSet", "server"))["scheduler"],
                         "ps-pscluster-scheduler:7070")

    def test_page_off(self):
        objs = objects({"scheduler": {"httpPort": 0}})
        self.assertNotIn("http_listen", args_of(by_kind(objs, "Deployment", "scheduler")))

    def test_renderer_refuses_what_it_does_not_know(self):
        r = render.Renderer({})
        with self.assertRaises(render.TemplateError):
            r.run(render._parse(render._tokenize("{{ nosuchfunc 1 }}"))[0], {}, {})


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
