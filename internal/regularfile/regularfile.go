package regularfile

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrNotRegular is a path that is not a regular file (a FIFO, a device, a
// directory); a symbolic link counts as its target.
var ErrNotRegular = errors.New("not a regular file")

// Open opens path for reading if it is (or links to) a regular file, with
// its FileInfo; otherwise it fails with ErrNotRegular naming the path and
// its kind, or with the stat/open error.
func Open(path string) (*os.File, os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, notRegular(path, st)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if st, err = f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = notRegular(path, st)
		}
		return nil, nil, err
	}
	return f, st, nil
}

func notRegular(path string, st os.FileInfo) error {
	return fmt.Errorf("%s: %w (%v)", path, ErrNotRegular, st.Mode().Type())
}
