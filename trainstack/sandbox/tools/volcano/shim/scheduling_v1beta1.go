// Identifiers that volcano.sh/apis v1.15.1 added to package scheduling/v1beta1 and that
// volcano.sh/volcano v1.15.1 uses, declared for a build against volcano.sh/apis v1.14.0.
//
// Why: the module proxy reachable from this project's machines answers 403 ("not available")
// for volcano.sh/apis v1.15.1, while it serves v1.14.0. The Job, PodGroup, Queue, Command
// and HyperNode CRD schemas of v1.14.1 and v1.15.1 are field-for-field the same
// (tests/e2e/test_toolchain.py checks that), so the wire types of v1.14.0 decode what a
// v1.15.1 cluster stores; what v1.15.1 adds to the Go package is this one constant.
// toolchain.py adds this file to the package with `go build -overlay`; nothing here is
// copied from upstream source. Definition: Volcano's design doc for queue allocation gates
// (docs/design/..., "API Constant Definition"): GroupName + "/queue-allocation-gate".

package v1beta1

// QueueAllocationGateKey is the annotation (and scheduling gate name) by which a pod opts in
// to Volcano's queue-admission scheduling gate.
const QueueAllocationGateKey = GroupName + "/queue-allocation-gate"
