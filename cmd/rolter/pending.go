package main

import "io"

func simMain(args []string, stdout, stderr io.Writer) int { return 2 }
func up(args []string, stdout, stderr io.Writer) int      { return 2 }
