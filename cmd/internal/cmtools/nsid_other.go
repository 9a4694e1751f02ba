//go:build !linux

package cmtools

import (
	"fmt"
	"os"
)

// fileIdentity names the file at path by what the platform offers without
// statx: its modification time and size (a file made again differs, as
// does one written to: the namespace then takes another identity).
func fileIdentity(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("mtime %d size %d", st.ModTime().UnixNano(), st.Size()), nil
}
