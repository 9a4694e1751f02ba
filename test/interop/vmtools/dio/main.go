//go:build linux

// Command dio is the block-device load of the interop lab's NVMe-oF
// benchmark (BenchmarkVMNvmf): -qd threads issue O_DIRECT preads (or
// pwrites with -write) of -bs bytes on a device for -time, at random
// block-aligned offsets within -range (or, with -seq, at consecutive
// offsets taken in turn by the threads, wrapping at -range), as fio's psync
// engine with numjobs does. The VM image has no fio; this is built static
// into the pair's initramfs and never runs on the host.
//
//	dio -bs 4096 -qd 16 -time 5s -range 64m /dev/nvme0n1
//	dio -bs 131072 -qd 4 -seq -time 5s /dev/nvme0n1
//
// It prints one line: "dio bs=B qd=Q rw=R ios=N secs=S IOPS=I MB/s=M".
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	bs := flag.Int("bs", 4096, "bytes per I/O (a multiple of 4096)")
	qd := flag.Int("qd", 16, "threads, each with one I/O outstanding")
	dur := flag.Duration("time", 5*time.Second, "how long")
	span := flag.String("range", "", "bytes of the device touched (k/m/g; default the whole device)")
	seq := flag.Bool("seq", false, "sequential offsets instead of random ones")
	write := flag.Bool("write", false, "write instead of read")
	flag.Parse()
	if flag.NArg() != 1 || *bs <= 0 || *bs%4096 != 0 || *qd <= 0 {
		fmt.Fprintln(os.Stderr, "usage: dio [-bs 4096] [-qd 16] [-time 5s] [-range 64m] [-seq] [-write] DEVICE")
		os.Exit(2)
	}
	mode := os.O_RDONLY
	if *write {
		mode = os.O_RDWR
	}
	f, err := os.OpenFile(flag.Arg(0), mode|syscall.O_DIRECT, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dio:", err)
		os.Exit(1)
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil || size <= 0 {
		fmt.Fprintln(os.Stderr, "dio: device size:", size, err)
		os.Exit(1)
	}
	if *span != "" {
		v, err := parseSize(*span)
		if err != nil || v <= 0 {
			fmt.Fprintln(os.Stderr, "dio: -range:", err)
			os.Exit(2)
		}
		size = min(size, v)
	}
	slots := size / int64(*bs)
	if slots == 0 {
		fmt.Fprintln(os.Stderr, "dio: -bs larger than the range")
		os.Exit(2)
	}
	var ios, next atomic.Int64
	var failed atomic.Value
	stop := time.Now().Add(*dur)
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < *qd; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Page-aligned memory for O_DIRECT.
			buf, err := syscall.Mmap(-1, 0, *bs, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				failed.CompareAndSwap(nil, err)
				return
			}
			seed := uint64(g)*0x9e3779b97f4a7c15 + 1
			for time.Now().Before(stop) && failed.Load() == nil {
				var slot int64
				if *seq {
					slot = (next.Add(1) - 1) % slots
				} else {
					seed ^= seed << 13
					seed ^= seed >> 7
					seed ^= seed << 17
					slot = int64(seed % uint64(slots))
				}
				off := slot * int64(*bs)
				if *write {
					_, err = f.WriteAt(buf, off)
				} else {
					_, err = f.ReadAt(buf, off)
				}
				if err != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("offset %d: %w", off, err))
					return
				}
				ios.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if err, _ := failed.Load().(error); err != nil {
		fmt.Fprintln(os.Stderr, "dio:", err)
		os.Exit(1)
	}
	rw := "randread"
	switch {
	case *seq && *write:
		rw = "write"
	case *seq:
		rw = "read"
	case *write:
		rw = "randwrite"
	}
	n := ios.Load()
	fmt.Printf("dio bs=%d qd=%d rw=%s ios=%d secs=%.2f IOPS=%.0f MB/s=%.2f\n", *bs, *qd, rw, n, secs, float64(n)/secs, float64(n)*float64(*bs)/secs/1e6)
}

func parseSize(s string) (int64, error) {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mul, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		mul, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"):
		mul, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mul, err
}
