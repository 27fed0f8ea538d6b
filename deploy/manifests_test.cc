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

TEST(ManifestsTest, ServersAreAStatefulSetWithCheckpointVolumesAndAHeadlessService) {
  auto m = ByKind("k8s/servers.yaml");
  ASSERT_EQ(m.count("StatefulSet"), 1u);
  ASSERT_EQ(m.count("Service"), 1u);
  EXPECT_EQ(m["Service"]["spec"]["clusterIP"].as<std::string>(), "None");
  const YAML::Node s = m["StatefulSet"];
  EXPECT_EQ(s["spec"]["serviceName"].as<std::string>(),
            m["Service"]["metadata"]["name"].as<std::string>());
  YAML::Node c = CheckPod(s, "server", 7000);
  EXPECT_EQ(s["spec"]["volumeClaimTemplates"][0]["metadata"]["name"].as<std::string>(),
            "checkpoints");
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--scheduler=pscluster-scheduler:7070"));
  EXPECT_THAT(args, HasSubstr("--listen=$(POD_IP):7000"));
  EXPECT_THAT(args, HasSubstr("--checkpoint_dir=/var/lib/pscluster/checkpoints"));
}

TEST(ManifestsTest, WorkersRequestGpus) {
  auto m = ByKind("k8s/workers.yaml");
  ASSERT_EQ(m.count("Deployment"), 1u);
  YAML::Node c = CheckPod(m["Deployment"], "worker", 7100);
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  std::string args;
  for (const auto& a : c["args"]) args += a.as<std::string>() + " ";
  EXPECT_THAT(args, HasSubstr("--device=cuda"));
}

TEST(ManifestsTest, KustomizationListsEveryManifest) {
  YAML::Node k = YAML::Load(Read("k8s/kustomization.yaml"));
  std::vector<std::string> files;
  for (const auto& r : k["resources"]) files.push_back(r.as<std::string>());
  EXPECT_THAT(files, ::testing::UnorderedElementsAre("namespace.yaml", "scheduler.yaml",
                                                     "servers.yaml", "workers.yaml"));
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
