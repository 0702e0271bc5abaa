// Command elasticprobe runs Volcano's own reclaim action, at the pinned version, on one
// scenario of an elastic job, under a scheduler configuration and with the rendezvous pod's
// labels and annotations it is given: ours, not upstream's (tests/e2e/test_scheduling.py,
// issue 43).
//
// The scenario (stdin: JSON {"conf", "storeLabels", "storeAnnotations", "expectEvicted"}):
// queue q1 runs an elastic job above its minimum, its rendezvous pod alone on node n1 (the
// only node of zone a), two workers on n2; PodGroup minMember 2 (the store and one worker),
// task minimums rendezvous 1 and worker 1. Queue q2's pending pod fits only on n1. Volcano's
// gang plugin permits `ready - minMember` victims of any role (gang.go), so reclaim takes the
// store unless the pod is left off the victim list before any plugin is asked
// (api/pod_info.go GetPodPreemptable; actions/reclaim/reclaim.go). It prints JSON {"ok",
// "error"}: whether the evictions were exactly `expectEvicted` (uthelper CheckEvict, whose
// message names the pods evicted otherwise).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"

	batch "volcano.sh/apis/pkg/apis/batch/v1alpha1"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	"volcano.sh/volcano/cmd/scheduler/app/options"
	"volcano.sh/volcano/pkg/scheduler"
	_ "volcano.sh/volcano/pkg/scheduler/actions" // registers the actions a conf names
	"volcano.sh/volcano/pkg/scheduler/actions/reclaim"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/plugins/binpack"
	"volcano.sh/volcano/pkg/scheduler/plugins/capacity"
	"volcano.sh/volcano/pkg/scheduler/plugins/conformance"
	"volcano.sh/volcano/pkg/scheduler/plugins/drf"
	"volcano.sh/volcano/pkg/scheduler/plugins/gang"
	"volcano.sh/volcano/pkg/scheduler/plugins/nodeorder"
	"volcano.sh/volcano/pkg/scheduler/plugins/predicates"
	"volcano.sh/volcano/pkg/scheduler/plugins/priority"
	"volcano.sh/volcano/pkg/scheduler/plugins/proportion"
	"volcano.sh/volcano/pkg/scheduler/uthelper"
	"volcano.sh/volcano/pkg/scheduler/util"
)

type input struct {
	Conf             string            `json:"conf"`
	StoreLabels      map[string]string `json:"storeLabels"`
	StoreAnnotations map[string]string `json:"storeAnnotations"`
	ExpectEvicted    []string          `json:"expectEvicted"`
}

type output struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func pod(name, node string, phase v1.PodPhase, cpu, group, task string, selector map[string]string) *v1.Pod {
	p := util.BuildPod("c1", name, node, phase, api.BuildResourceList(cpu, "1G"), group, map[string]string{}, selector)
	if task != "" {
		p.Annotations[batch.TaskSpecKey] = task
	}
	return p
}

func node(name, cpu string, labels map[string]string) *v1.Node {
	return util.BuildNode(name, api.BuildResourceList(cpu, "100Gi", []api.ScalarResource{{Name: "pods", Value: "100"}}...), labels)
}

func run(in input) error {
	_, tiers, configurations, _, err := scheduler.UnmarshalSchedulerConf(in.Conf)
	if err != nil {
		return fmt.Errorf("scheduler conf: %w", err)
	}
	zoneA := map[string]string{"zone": "a"}
	store := pod("e-rendezvous-0", "n1", v1.PodRunning, "1", "pg-e", "rendezvous", nil)
	for k, v := range in.StoreLabels {
		store.Labels[k] = v
	}
	for k, v := range in.StoreAnnotations {
		store.Annotations[k] = v
	}
	// Equal shares: q1 holds 3 of 3 CPUs, q2 asks for 1, so q2 is below what it deserves
	// under either share plugin (capacity: deserved; proportion: weight).
	share := v1.ResourceList(api.BuildResourceList("2", "100Gi"))
	q1 := util.BuildQueueWithResourcesQuantity("q1", share, nil)
	q2 := util.BuildQueueWithResourcesQuantity("q2", share, nil)
	// capacity's hierarchy hangs every queue under "root", which must be in the session
	// (plugins/capacity/capacity.go: without it the hierarchy is skipped and nothing reclaims).
	root := util.BuildQueue("root", 1, nil)
	q1.Spec.Parent, q2.Spec.Parent = "root", "root"
	test := uthelper.TestCommonStruct{
		Name: "elastic store alone on the node a lender needs",
		Plugins: map[string]framework.PluginBuilder{
			priority.PluginName:    priority.New,
			gang.PluginName:        gang.New,
			conformance.PluginName: conformance.New,
			drf.PluginName:         drf.New,
			proportion.PluginName:  proportion.New,
			capacity.PluginName:    capacity.New,
			predicates.PluginName:  predicates.New,
			nodeorder.PluginName:   nodeorder.New,
			binpack.PluginName:     binpack.New,
		},
		PodGroups: []*schedulingv1beta1.PodGroup{
			util.BuildPodGroup("pg-e", "c1", "q1", 2, map[string]int32{"rendezvous": 1, "worker": 1}, schedulingv1beta1.PodGroupRunning),
			util.BuildPodGroup("pg-p", "c1", "q2", 1, nil, schedulingv1beta1.PodGroupInqueue),
		},
		Pods: []*v1.Pod{
			store,
			pod("e-worker-0", "n2", v1.PodRunning, "1", "pg-e", "worker", nil),
			pod("e-worker-1", "n2", v1.PodRunning, "1", "pg-e", "worker", nil),
			pod("p-0", "", v1.PodPending, "1", "pg-p", "", zoneA),
		},
		Nodes:          []*v1.Node{node("n1", "1", zoneA), node("n2", "2", nil)},
		Queues:         []*schedulingv1beta1.Queue{root, q1, q2},
		ExpectEvictNum: len(in.ExpectEvicted),
		ExpectEvicted:  in.ExpectEvicted,
	}
	test.RegisterSession(tiers, configurations)
	defer test.Close()
	test.Run([]framework.Action{reclaim.New()})
	return test.CheckAll(0)
}

func main() {
	options.Default()
	// The fake clientsets of volcano.sh/apis v1.14.0 (the build's shim) predate watch-list
	// bookmarks: the scheduler cache's informers would wait for one for ever.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{"WatchListClient": false}); err != nil {
		panic(err)
	}
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "elasticprobe: bad input:", err)
		os.Exit(2)
	}
	out := output{OK: true}
	if err := run(in); err != nil {
		out = output{OK: false, Error: err.Error()}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
}
