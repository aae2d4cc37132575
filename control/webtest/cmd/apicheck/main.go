// Command apicheck answers questions about exchanges with the control plane against an OpenAPI document,
// one JSON line per question on stdin (package apicheck, Serve): the control package's tests run it, so
// that their validator, kin-openapi, stays out of the gateway's module.
//
//	apicheck openapi.json
package main

import (
	"fmt"
	"os"

	"github.com/rolter-ai/rolter/control/webtest/apicheck"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: apicheck openapi.json")
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return fmt.Errorf("cannot read the document: %w", err)
	}
	c, err := apicheck.Load(data)
	if err != nil {
		return err
	}
	return c.Serve(os.Stdin, os.Stdout)
}
