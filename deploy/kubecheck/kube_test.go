// Package kubecheck decodes deploy/kubernetes strictly into the Kubernetes API
// types (k8s.io/api), so a misspelled or misplaced field, a wrong type or a
// bad quantity fails. It is a module of its own so the sequencer module does
// not carry the Kubernetes API types; scripts/deploy-check.sh runs it. It
// checks the schema of each object only: nothing is applied to a cluster and
// the API server's own validation (required fields, immutability) is not run.
package kubecheck

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func TestManifestsDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	kinds := map[string]int{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yamlv3.NewDecoder(bytes.NewReader(b))
		for {
			var node yamlv3.Node
			if err := dec.Decode(&node); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			doc, err := yamlv3.Marshal(&node)
			if err != nil {
				t.Fatal(err)
			}
			var meta struct{ Kind, APIVersion string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 StatefulSet":
				obj = &appsv1.StatefulSet{}
			case "v1 Service":
				obj = &corev1.Service{}
			case "v1 Secret":
				obj = &corev1.Secret{}
			case "v1 Namespace":
				obj = &corev1.Namespace{}
			case "policy/v1 PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			default:
				t.Errorf("%s: no strict check for %s %s: add its type here", f, meta.APIVersion, meta.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s: %s: %v", f, meta.Kind, err)
			}
			kinds[meta.Kind]++
		}
	}
	for _, k := range []string{"StatefulSet", "Service", "Secret", "PodDisruptionBudget", "Namespace"} {
		if kinds[k] == 0 {
			t.Errorf("no %s decoded", k)
		}
	}
	t.Logf("decoded strictly: %v", kinds)
}
