#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& rel) {
  std::ifstream f(std::string(std::getenv("TEST_SRCDIR")) + "/pscluster/deploy/" + rel);
  EXPECT_TRUE(f.good()) << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<YAML::Node> Docs(const std::string& rel) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& d : YAML::LoadAll(Read(rel))) {
    if (d.IsMap()) out.push_back(d);
  }
  return out;
}

std::map<std::string, YAML::Node> ByKind(const std::string& rel) {
  std::map<std::string, YAML::Node> m;
  for (const YAML::Node& d : Docs(rel)) m[d["kind"].as<std::string>()] = d;
  return m;
}

void ExpectLabels(const YAML::Node& meta, const std::string& component) {
  const YAML::Node labels = meta["labels"];
  ASSERT_TRUE(labels.IsMap()) << meta;
  EXPECT_EQ(labels["app.kubernetes.io/name"].as<std::string>(), "pscluster");
  EXPECT_EQ(labels["app.kubernetes.io/part-of"].as<std::string>(), "pscluster");
  EXPECT_EQ(labels["app.kubernetes.io/component"].as<std::string>(), component);
}

// The pod template: labels, one container with gRPC probes on its port.
YAML::Node CheckPod(const YAML::Node& workload, const std::string& component, int port) {
  ExpectLabels(workload["metadata"], component);
  const YAML::Node tmpl = workload["spec"]["template"];
  ExpectLabels(tmpl["metadata"], component);
  for (auto it = workload["spec"]["selector"]["matchLabels"].begin();
       it != workload["spec"]["selector"]["matchLabels"].end(); ++it) {
    EXPECT_EQ(tmpl["metadata"]["labels"][it->first.as<std::string>()].as<std::string>(),
              it->second.as<std::string>());
  }
  const YAML::Node c = tmpl["spec"]["containers"][0];
  EXPECT_EQ(c["ports"][0]["containerPort"].as<int>(), port);
  EXPECT_EQ(c["livenessProbe"]["grpc"]["port"].as<int>(), port);
  EXPECT_EQ(c["readinessProbe"]["grpc"]["port"].as<int>(), port);
  EXPECT_TRUE(tmpl["spec"]["securityContext"]["runAsNonRoot"].as<bool>());
  return c;
}

// The pod template carries Prometheus' scrape annotations and a metrics port.
void ExpectScraped(const YAML::Node& workload, int port) {
  const YAML::Node a = workload["spec"]["template"]["metadata"]["annotations"];
  ASSERT_TRUE(a.IsMap()) << workload["metadata"]["name"];
  EXPECT_EQ(a["prometheus.io/scrape"].as<std::string>(), "true");
  EXPECT_EQ(a["prometheus.io/port"].as<std::string>(), std::to_string(port));
  EXPECT_EQ(a["prometheus.io/path"].as<std::string>(), "/metrics");
  bool has_port = false;
  for (const auto& p : workload["spec"]["template"]["spec"]["containers"][0]["ports"]) {
    has_port = has_port || (p["name"].as<std::string>() == "metrics" &&
                            p["containerPort"].as<int>() == port);
  }
  EXPECT_TRUE(has_port) << workload["metadata"]["name"];
}

// Pod volumes by name: the claim each one names.
std::map<std::string, std::string> Volumes(const YAML::Node& workload) {
  std::map<std::string, std::string> out;
  for (const auto& v : workload["spec"]["template"]["spec"]["volumes"]) {
    out[v["name"].as<std::string>()] = v["persistentVolumeClaim"]["claimName"].as<std::string>();
  }
  return out;
}

// A container's mounts: volume name -> path.
std::map<std::string, std::string> Mounts(const YAML::Node& container) {
  std::map<std::string, std::string> out;
  for (const auto& m : container["volumeMounts"]) {
    out[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  }
  return out;
}

TEST(ManifestsTest, Scheduler) {
  auto m = ByKind("k8s/scheduler.yaml");
  ASSERT_EQ(m.count("Deployment"), 1u);
  ASSERT_EQ(m.count("Service"), 1u);
  ASSERT_EQ(m.count("PersistentVolumeClaim"), 1u);
  const YAML::Node d = m["Deployment"];
  EXPECT_EQ(d["spec"]["replicas"].as<int>(), 1);
  EXPECT_EQ(d["spec"]["strategy"]["type"].as<std::string>(), "Recreate");
  YAML::Node c = CheckPod(d, "scheduler", 7070);
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--db=/var/lib/pscluster/db/"));
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"].as<std::string>(), "/var/lib/pscluster/db");
  EXPECT_EQ(m["Service"]["spec"]["ports"][0]["port"].as<int>(), 7070);
  EXPECT_THAT(args, HasSubstr("--metrics_listen=0.0.0.0:9090"));
  EXPECT_EQ(d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as<std::string>(),
            "9090");
}

TEST(ManifestsTest, ServersAreAStatefulSetWithSharedCheckpointsAndAHeadlessService) {
  auto m = ByKind("k8s/base/servers.yaml");
  ASSERT_EQ(m.count("StatefulSet"), 1u);
  ASSERT_EQ(m.count("Service"), 1u);
  EXPECT_EQ(m["Service"]["spec"]["clusterIP"].as<std::string>(), "None");
  const YAML::Node s = m["StatefulSet"];
  EXPECT_EQ(s["spec"]["serviceName"].as<std::string>(),
            m["Service"]["metadata"]["name"].as<std::string>());
  YAML::Node c = CheckPod(s, "server", 7000);
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--scheduler=pscluster-scheduler:7070"));
  EXPECT_THAT(args, HasSubstr("--listen=$(POD_IP):7000"));
  EXPECT_THAT(args, HasSubstr("--checkpoint_dir=/var/lib/pscluster/checkpoints"));
  EXPECT_THAT(args, HasSubstr("--metrics_listen=0.0.0.0:9090"));
  ExpectScraped(s, 9090);
  // The checkpoints are one shared volume (the scheduler mounts it too), not one per server:
  // a job that loses a server rolls back to its newest checkpoint.
  EXPECT_FALSE(s["spec"]["volumeClaimTemplates"]);
  EXPECT_EQ(Volumes(s)["checkpoints"], "pscluster-checkpoints");
  EXPECT_EQ(Volumes(s)["exports"], "pscluster-exports");
  EXPECT_EQ(Mounts(c)["checkpoints"], "/var/lib/pscluster/checkpoints");
  EXPECT_EQ(Volumes(ByKind("k8s/scheduler.yaml")["Deployment"])["checkpoints"],
            "pscluster-checkpoints");
  EXPECT_EQ(Mounts(ByKind("k8s/scheduler.yaml")["Deployment"]["spec"]["template"]["spec"]
                       ["containers"][0])["checkpoints"],
            "/var/lib/pscluster/checkpoints");
}

TEST(ManifestsTest, SharedVolumesAreReadWriteMany) {
  std::map<std::string, YAML::Node> claims;
  for (const YAML::Node& d : Docs("k8s/base/storage.yaml")) {
    ASSERT_EQ(d["kind"].as<std::string>(), "PersistentVolumeClaim");
    claims[d["metadata"]["name"].as<std::string>()] = d;
  }
  ASSERT_EQ(claims.size(), 2u);
  for (const char* name : {"pscluster-checkpoints", "pscluster-exports"}) {
    ASSERT_EQ(claims.count(name), 1u) << name;
    EXPECT_EQ(claims[name]["spec"]["accessModes"][0].as<std::string>(), "ReadWriteMany") << name;
  }
}

TEST(ManifestsTest, WorkersRequestGpus) {
  auto m = ByKind("k8s/base/workers.yaml");
  ASSERT_EQ(m.count("Deployment"), 1u);
  YAML::Node c = CheckPod(m["Deployment"], "worker", 7100);
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--device=cuda"));
  EXPECT_THAT(args, HasSubstr("--metrics_listen=0.0.0.0:9090"));
  ExpectScraped(m["Deployment"], 9090);
  // GPU pods run the GPU image (the CPU-only one cannot use the GPU they ask for).
  EXPECT_EQ(c["image"].as<std::string>(), "pscluster-gpu:0.1.0");
  EXPECT_EQ(Volumes(m["Deployment"])["exports"], "pscluster-exports");
  EXPECT_EQ(Mounts(c)["exports"], "/var/lib/pscluster/exports");
}

// The resources a kustomization lists.
std::vector<std::string> Resources(const std::string& rel) {
  YAML::Node k = YAML::Load(Read(rel));
  std::vector<std::string> out;
  for (const auto& r : k["resources"]) out.push_back(r.as<std::string>());
  return out;
}

TEST(ManifestsTest, KustomizationListsEveryManifest) {
  EXPECT_THAT(Resources("k8s/base/kustomization.yaml"),
              ::testing::UnorderedElementsAre("namespace.yaml", "storage.yaml", "servers.yaml",
                                              "workers.yaml"));
  EXPECT_THAT(Resources("k8s/kustomization.yaml"),
              ::testing::UnorderedElementsAre("base", "scheduler.yaml"));
  EXPECT_THAT(Resources("k8s/ha/kustomization.yaml"),
              ::testing::UnorderedElementsAre("../base", "etcd.yaml", "scheduler.yaml"));
  // Both modes' servers and workers reach the scheduler through the same Service.
  EXPECT_EQ(ByKind("k8s/scheduler.yaml")["Service"]["metadata"]["name"].as<std::string>(),
            "pscluster-scheduler");
  EXPECT_EQ(Docs("k8s/ha/scheduler.yaml")[1]["metadata"]["name"].as<std::string>(),
            "pscluster-scheduler");
  for (const char* f : {"k8s/base/servers.yaml", "k8s/base/workers.yaml"}) {
    EXPECT_THAT(Read(f), HasSubstr("--scheduler=pscluster-scheduler:7070")) << f;
  }
}

// Three schedulers over etcd: no database volume, each advertising its pod IP, alive by TCP and
// ready only while leading (gRPC health), behind the Service the daemons call and a headless
// Service of all of them.
TEST(ManifestsTest, HighlyAvailableSchedulersOverEtcd) {
  const std::vector<YAML::Node> docs = Docs("k8s/ha/scheduler.yaml");
  ASSERT_EQ(docs.size(), 3u);
  const YAML::Node d = docs[0];
  ASSERT_EQ(d["kind"].as<std::string>(), "Deployment");
  EXPECT_EQ(d["spec"]["replicas"].as<int>(), 3);
  ExpectLabels(d["metadata"], "scheduler");
  const YAML::Node c = d["spec"]["template"]["spec"]["containers"][0];
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--etcd_endpoints=pscluster-etcd-0.pscluster-etcd:2379,"
                              "pscluster-etcd-1.pscluster-etcd:2379,"
                              "pscluster-etcd-2.pscluster-etcd:2379 "));
  EXPECT_THAT(args, HasSubstr("--advertise_address=$(POD_IP):7070"));
  EXPECT_THAT(args, ::testing::Not(HasSubstr("--db")));
  EXPECT_EQ(c["env"][0]["name"].as<std::string>(), "POD_IP");
  EXPECT_EQ(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(), "status.podIP");
  EXPECT_EQ(c["livenessProbe"]["tcpSocket"]["port"].as<int>(), 7070);
  EXPECT_EQ(c["readinessProbe"]["grpc"]["port"].as<int>(), 7070);
  EXPECT_EQ(Volumes(d)["checkpoints"], "pscluster-checkpoints");
  EXPECT_EQ(Volumes(d).count("db"), 0u);
  ASSERT_EQ(docs[1]["kind"].as<std::string>(), "Service");
  EXPECT_FALSE(docs[1]["spec"]["clusterIP"].IsDefined());
  ASSERT_EQ(docs[2]["kind"].as<std::string>(), "Service");
  EXPECT_EQ(docs[2]["metadata"]["name"].as<std::string>(), "pscluster-scheduler-peers");
  EXPECT_EQ(docs[2]["spec"]["clusterIP"].as<std::string>(), "None");
  EXPECT_TRUE(docs[2]["spec"]["publishNotReadyAddresses"].as<bool>());
  for (const YAML::Node& svc : {docs[1], docs[2]}) {
    EXPECT_EQ(svc["spec"]["selector"]["app.kubernetes.io/component"].as<std::string>(),
              "scheduler");
  }
}

// The etcd the schedulers use: three members of one initial cluster, each named after its pod
// and reachable at the names the schedulers are given, only from the schedulers and members.
TEST(ManifestsTest, AThreeMemberEtcdForTheSchedulers) {
  auto m = ByKind("k8s/ha/etcd.yaml");
  ASSERT_EQ(m.count("StatefulSet"), 1u);
  ASSERT_EQ(m.count("Service"), 1u);
  ASSERT_EQ(m.count("NetworkPolicy"), 1u);
  const YAML::Node s = m["StatefulSet"];
  EXPECT_EQ(s["spec"]["replicas"].as<int>(), 3);
  EXPECT_EQ(s["spec"]["serviceName"].as<std::string>(), "pscluster-etcd");
  EXPECT_EQ(m["Service"]["metadata"]["name"].as<std::string>(), "pscluster-etcd");
  EXPECT_EQ(m["Service"]["spec"]["clusterIP"].as<std::string>(), "None");
  std::string args;
  for (const auto& a : s["spec"]["template"]["spec"]["containers"][0]["args"]) {
    args += a.as<std::string>() + " ";
  }
  for (int i = 0; i < 3; ++i) {
    const std::string member = "pscluster-etcd-" + std::to_string(i);
    EXPECT_THAT(args, HasSubstr(member + "=http://" + member +
                                ".pscluster-etcd.pscluster.svc:2380"));
  }
  EXPECT_THAT(args, HasSubstr("--name=$(POD_NAME)"));
  EXPECT_THAT(args, HasSubstr("--listen-client-urls=http://0.0.0.0:2379"));
  std::vector<std::string> allowed;
  for (const auto& from : m["NetworkPolicy"]["spec"]["ingress"][0]["from"]) {
    allowed.push_back(
        from["podSelector"]["matchLabels"]["app.kubernetes.io/component"].as<std::string>());
  }
  EXPECT_THAT(allowed, ::testing::UnorderedElementsAre("scheduler", "etcd"));
}

// The Dockerfile builds a GPU image beside the CPU one: the CUDA toolkit in its build stage
// (which fails without nvcc rather than ship a CPU-only worker), cuBLAS and the CUDA runtime in
// its runtime stage; the CPU image stays the default (last) target.
TEST(ManifestsTest, DockerfileBuildsAGpuImage) {
  const std::string d = Read("Dockerfile");
  const size_t gpu_build = d.find("AS build-gpu");
  const size_t gpu = d.find("AS gpu\n");
  const size_t cpu = d.find("AS cpu\n");
  ASSERT_NE(gpu_build, std::string::npos);
  ASSERT_NE(gpu, std::string::npos);
  ASSERT_NE(cpu, std::string::npos);
  EXPECT_LT(gpu, cpu) << "the CPU image is the default target";
  const std::string build = d.substr(gpu_build, gpu - gpu_build);
  EXPECT_THAT(build, HasSubstr("cuda-nvcc-"));
  EXPECT_THAT(build, HasSubstr("libcublas-dev-"));
  EXPECT_THAT(build, HasSubstr("test -x /usr/local/cuda/bin/nvcc"));
  const std::string runtime = d.substr(gpu, cpu - gpu);
  EXPECT_THAT(runtime, HasSubstr("libcublas-${CUDA_MAJOR_MINOR}"));
  EXPECT_THAT(runtime, HasSubstr("cuda-cudart-${CUDA_MAJOR_MINOR}"));
  EXPECT_THAT(runtime, HasSubstr("COPY --from=build-gpu"));
  EXPECT_THAT(d, HasSubstr("--target gpu -t pscluster-gpu:0.1.0"));
}

TEST(ManifestsTest, SystemdUnitsRunTheDaemons) {
  EXPECT_THAT(Read("systemd/ps-scheduler.service"), HasSubstr("ExecStart=/usr/local/bin/ps_scheduler"));
  EXPECT_THAT(Read("systemd/ps-server.service"), HasSubstr("ExecStart=/usr/local/bin/ps_server"));
  EXPECT_THAT(Read("systemd/ps-worker.service"), HasSubstr("ExecStart=/usr/local/bin/ps_worker"));
  for (const char* unit : {"ps-scheduler", "ps-server", "ps-worker"}) {
    EXPECT_THAT(Read(std::string("systemd/") + unit + ".service"), HasSubstr("Restart=on-failure"));
  }
}

}  // namespace
