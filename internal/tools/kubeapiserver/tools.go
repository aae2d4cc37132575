//go:build tools

// Package kubeapiserver pins the kube-apiserver that internal/kubetest starts: this module exists only so
// `go build k8s.io/kubernetes/cmd/kube-apiserver` resolves one version, outside the gateway's go.mod.
package kubeapiserver

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
