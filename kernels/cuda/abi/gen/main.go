package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/dsv4mla/prologue/kernels/cuda/abi"
)

func main() {
	out := flag.String("o", abi.HeaderFile, "output file")
	flag.Parse()
	if err := os.WriteFile(*out, []byte(abi.Header()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
