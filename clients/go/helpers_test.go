package reflex

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

func clientsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// fakeServer is used ONLY for fault injection (no ready line, garbage, slow
// answers, a child that dies); everything else runs against the real server.
func fakeServer(mode, delay string) Options {
	return Options{
		Command: "python3",
		Args:    []string{filepath.Join(clientsDir(), "testdata", "fake_server.py")},
		Env:     append(os.Environ(), "FAKE_MODE="+mode, "FAKE_TOKEN_DELAY="+delay),
	}
}

// reflexOptions starts the real server on stdio ($REFLEX_CMD overrides).
func reflexOptions(extra ...string) Options {
	cmd := os.Getenv("REFLEX_CMD")
	if strings.TrimSpace(cmd) == "" {
		cmd = "reflex stdio"
	}
	argv := strings.Fields(cmd)
	return Options{Command: argv[0], Args: append(argv[1:], extra...)}
}
