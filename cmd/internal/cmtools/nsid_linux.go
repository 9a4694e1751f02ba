//go:build linux

package cmtools

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// fileIdentity names the file at path as it is now: its device, inode and
// birth time (statx), which a file removed and made again at the same path
// does not keep, even where the inode number is given again.
func fileIdentity(path string) (string, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_INO|unix.STATX_BTIME, &st); err != nil {
		return "", err
	}
	id := fmt.Sprintf("dev %d:%d ino %d", st.Dev_major, st.Dev_minor, st.Ino)
	if st.Mask&unix.STATX_BTIME != 0 {
		id += fmt.Sprintf(" born %d.%09d", st.Btime.Sec, st.Btime.Nsec)
	}
	if st.Rdev_major != 0 || st.Rdev_minor != 0 {
		id += fmt.Sprintf(" rdev %d:%d", st.Rdev_major, st.Rdev_minor)
	}
	return id, nil
}
