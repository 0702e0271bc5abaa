// kubelet-subpath: what the kubelet does with a container's volume mount that has a subPath,
// by calling the kubelet's own code at the pinned version, for tests/e2e/test_escapes.py.
//
// It performs the steps of k8s.io/kubernetes v1.37.2 pkg/kubelet/kubelet_pods.go makeMounts
// (the subPath branch, l.328-372) in their order, with the same functions:
//
//  1. refuse an absolute subPath or one with `..` (volumevalidation.ValidatePathNoBacksteps);
//  2. hostPath := volumePath/subPath; if it does not exist (hostutil PathExists), create it
//     with the volume root's mode (hostutil GetMode, then subpath SafeMakeDir);
//  3. subpath PrepareSafeSubpath: resolve it on the host, refuse a result outside the volume,
//     and bind-mount it under the pod's directory, which is what the container gets.
//
// Usage: kubelet-subpath <volumePath> <subPath> <podDir>. Prints one JSON object: the bind
// mount's path (`hostPath`) and what it holds, or the kubelet's `error` and the stage that
// refused. Needs CAP_SYS_ADMIN for the bind mount: the tests run it in a mount namespace of
// their own, which ends with it.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	volumevalidation "k8s.io/kubernetes/pkg/volume/validation"
	"k8s.io/mount-utils"
)

type result struct {
	HostPath string `json:"hostPath,omitempty"`
	Stage    string `json:"stage,omitempty"`
	Error    string `json:"error,omitempty"`
	Created  bool   `json:"created"`
	// What the container would see at its mount: the names in the bound directory.
	Entries []string `json:"entries,omitempty"`
	// With KUBELET_SUBPATH_WRITE=1: the error of creating a file there (empty: it worked).
	WriteError *string `json:"writeError,omitempty"`
}

func run(volumePath, subPath, podDir string) result {
	if filepath.IsAbs(subPath) {
		return result{Stage: "validate", Error: fmt.Sprintf("error SubPath `%s` must not be an absolute path", subPath)}
	}
	if err := volumevalidation.ValidatePathNoBacksteps(subPath); err != nil {
		return result{Stage: "validate", Error: fmt.Sprintf("unable to provision SubPath `%s`: %v", subPath, err)}
	}
	hu := hostutil.NewHostUtil()
	sp := subpath.New(mount.New(""))
	hostPath := filepath.Join(volumePath, subPath)
	res := result{}
	exists, err := hu.PathExists(hostPath)
	if err != nil {
		return result{Stage: "exists", Error: fmt.Sprintf("error checking if path exists: %v", err)}
	}
	if !exists {
		perm, err := hu.GetMode(volumePath)
		if err != nil {
			return result{Stage: "mode", Error: err.Error()}
		}
		if err := sp.SafeMakeDir(subPath, volumePath, perm); err != nil {
			return result{Stage: "mkdir", Error: fmt.Sprintf("failed to create subPath directory for volumeMount: %v", err)}
		}
		res.Created = true
	}
	bound, _, err := sp.PrepareSafeSubpath(subpath.Subpath{
		VolumeMountIndex: 0,
		Path:             hostPath,
		VolumeName:       "volume",
		VolumePath:       volumePath,
		PodDir:           podDir,
		ContainerName:    "trainer",
	})
	if err != nil {
		return result{Stage: "bind", Error: err.Error(), Created: res.Created}
	}
	res.HostPath = bound
	if entries, err := os.ReadDir(bound); err == nil {
		for _, e := range entries {
			res.Entries = append(res.Entries, e.Name())
		}
	}
	if os.Getenv("KUBELET_SUBPATH_WRITE") == "1" {
		msg := ""
		if err := os.WriteFile(filepath.Join(bound, "written-by-the-probe"), []byte("x"), 0o644); err != nil {
			msg = err.Error()
		}
		res.WriteError = &msg
	}
	return res
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-subpath VOLUME_PATH SUB_PATH POD_DIR")
		os.Exit(2)
	}
	out, _ := json.Marshal(run(os.Args[1], os.Args[2], os.Args[3]))
	fmt.Println(string(out))
}
