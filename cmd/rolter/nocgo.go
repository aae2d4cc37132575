//go:build !cgo

package main

const kvEventsBuild = false
