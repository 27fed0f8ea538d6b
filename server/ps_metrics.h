// The server's Prometheus metrics: registered on a common/metrics registry as families computed
// at scrape time from the handler's Status (one snapshot per scrape).
#ifndef PSCLUSTER_SERVER_PS_METRICS_H_
#define PSCLUSTER_SERVER_PS_METRICS_H_

#include "common/metrics.h"
#include "server/ps_handler.h"

namespace pscluster {

// REQUIRES: handler outlives the registry's use.
void RegisterServerMetrics(PsHandler* handler, MetricsRegistry* registry);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PS_METRICS_H_
