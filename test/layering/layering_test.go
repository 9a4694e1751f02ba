package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is this module's path.
const module = "github.com/gorocev2/rocev2"

// pkg is what the test needs of one `go list -json` package.
type pkg struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// rel is p relative to the module ("transport", "test/golden"); "" for a
// path outside the module.
func rel(p string) string {
	if r, ok := strings.CutPrefix(p, module+"/"); ok {
		return r
	}
	return ""
}

// under reports whether module-relative path r is dir or below it.
func under(r, dir string) bool { return r == dir || strings.HasPrefix(r, dir+"/") }

// standard reports whether import path p is in the standard library (its
// first element has no dot).
func standard(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

var (
	headers = []string{"bth", "reth", "aeth", "atomiceth", "deth", "immdt", "icrc"}
	wire    = append(slices.Clone(headers), "packet", "rocelayer", "cm")
)

// rule is what a product package's non-test code may import of the module
// (ours), which other imports it must not have (banned, by prefix), and
// why.
type rule struct {
	ours   []string
	banned []string
	why    string
}

// socketImports are what "reaches the network only through udp" rules out.
var socketImports = []string{"syscall", "golang.org/x/sys", "golang.org/x/net", "os/exec", "github.com/cilium",
	module + "/internal/netns", module + "/udp/faults", module + "/udp/share"}

// ruleFor returns the rule for module-relative package r, or false if
// there is none. Packages under cmd/ and test/ have no rule for their
// non-test imports beyond "cmd/ never imports test/" (and "cmd/internal/svgplot
// imports only the standard library"), checked separately.
func ruleFor(r string) (rule, bool) {
	switch {
	case slices.Contains(headers, r):
		return rule{why: "wire header packages import nothing of this module"}, true
	case r == "cm":
		return rule{ours: []string{"bth"}, why: "cm (the CM MAD wire format) imports only bth of this module (its path MTU type)"}, true
	case r == "nvme":
		return rule{why: "nvme (the NVMe-oF wire format) imports nothing of this module"}, true
	case r == "nvmf":
		return rule{ours: append(slices.Clone(wire), "nvme", "memreg", "transport", "rdmacm"), banned: socketImports,
			why: "nvmf (NVMe-oF target and host) imports wire packages, nvme, memreg, transport and rdmacm, and reaches the network only through them"}, true
	case r == "packet":
		return rule{ours: headers, why: "packet imports only the wire header packages"}, true
	case r == "rocelayer":
		return rule{ours: wire, why: "rocelayer imports only wire packages"}, true
	case r == "memreg":
		return rule{ours: wire, why: "memreg imports only wire packages"}, true
	case r == "udp":
		return rule{ours: append(slices.Clone(wire), "internal/netns", "udp/share"), why: "udp imports only wire packages, internal/netns and udp/share"}, true
	case r == "udp/share":
		return rule{ours: []string{"internal/netns"}, why: "udp/share (the SO_REUSEPORT steering program) imports only internal/netns of this module"}, true
	case r == "udp/memnet":
		return rule{ours: append(slices.Clone(wire), "udp"), why: "udp/memnet (the in-memory network) imports only wire packages and udp"}, true
	case r == "udp/faults":
		return rule{ours: []string{"internal/netns"}, why: "udp/faults imports only internal/netns of this module"}, true
	case r == "dcqcn":
		return rule{why: "dcqcn (congestion control arithmetic) imports nothing of this module"}, true
	case r == "transport":
		return rule{ours: append(slices.Clone(wire), "memreg", "udp", "dcqcn"), banned: socketImports,
			why: "transport imports only wire packages, memreg, udp and dcqcn, and reaches the network only through udp"}, true
	case r == "internal/netns":
		return rule{why: "internal/netns imports nothing of this module"}, true
	case r == "rdmacm":
		return rule{ours: append(slices.Clone(wire), "memreg", "transport", "internal/cmjournal"), banned: socketImports,
			why: "rdmacm (the connection manager) builds on cm, memreg, transport and internal/cmjournal; it reaches the network only through transport's GSI"}, true
	case r == "rdmacm/guardian":
		return rule{ours: []string{"rdmacm", "transport", "udp", "internal/cmjournal"},
			why: "rdmacm/guardian (the process that sends a killed process's DREQs) builds on rdmacm, transport, udp (its socket link) and internal/cmjournal"}, true
	case r == "internal/cmjournal":
		return rule{why: "internal/cmjournal (the connection journal's files and locks) imports nothing of this module"}, true
	}
	return rule{}, false
}

// cmdShared are the packages under cmd/internal that the commands share
// (none of them is a command).
var cmdShared = []string{"cmd/internal/cli", "cmd/internal/cpudist", "cmd/internal/oob", "cmd/internal/pcaptap", "cmd/internal/svgplot"}

// cmdFamilies are rocev2d's command packages: each exports its commands
// (Commands() []cli.Command) for cmd/rocev2d's dispatch.
var cmdFamilies = []string{"bench", "cmtools", "congestion", "demo", "faultscmd", "pcapcmd", "perftest", "pingpong",
	"scale", "sharecmd", "soak"}

// cmdRule is what a package under cmd/ may import of the module under
// cmd/ (or, with onlyCmd, of the whole module), and why.
type cmdRule struct {
	ours    []string
	onlyCmd bool
	why     string
}

// cmdRuleFor returns the rule for module-relative package r under cmd/, or
// false if there is none.
func cmdRuleFor(r string) (cmdRule, bool) {
	family := func(n string) string { return "cmd/internal/" + n }
	switch {
	case r == "cmd/rocev2d":
		ours := []string{"cmd/internal/cli"}
		for _, f := range cmdFamilies {
			ours = append(ours, family(f))
		}
		return cmdRule{ours: ours, onlyCmd: true,
			why: "cmd/rocev2d's main only dispatches: it imports the command packages and cmd/internal/cli, nothing else of the module"}, true
	case slices.Contains(cmdFamilies, strings.TrimPrefix(r, "cmd/internal/")) && under(r, "cmd/internal"):
		return cmdRule{ours: cmdShared,
			why: "a command package imports under cmd/ only the shared packages (cli, cpudist, oob, pcaptap, svgplot): never another command package, cmd/rocev2d or cmd/internal/clitest"}, true
	case r == "cmd/internal/cli":
		return cmdRule{ours: []string{"cmd/internal/pcaptap"}, why: "cmd/internal/cli imports under cmd/ only cmd/internal/pcaptap"}, true
	case r == "cmd/internal/clitest":
		return cmdRule{ours: []string{"cmd/internal/cli"}, why: "cmd/internal/clitest (test helpers, imported only by tests) imports under cmd/ only cmd/internal/cli"}, true
	case slices.Contains(cmdShared, r):
		return cmdRule{why: r + " (shared by the commands) imports nothing under cmd/"}, true
	}
	return cmdRule{}, false
}

// allowedNet are the identifiers of package net that transport may use.
var allowedNet = []string{"ErrClosed"}

// violations checks pkgs and returns one line per broken rule. files
// opens a package file to find the import in it (nil: no file names).
func violations(pkgs []pkg, files func(p *pkg, names []string) []parsedFile) []string {
	var out []string
	report := func(p *pkg, names []string, imp, why string) {
		where := rel(p.ImportPath)
		if files != nil {
			for _, f := range files(p, names) {
				if slices.Contains(f.imports, imp) {
					where = filepath.ToSlash(filepath.Join(rel(p.ImportPath), f.name))
					break
				}
			}
		}
		out = append(out, fmt.Sprintf("%s imports %s: %s", where, imp, why))
	}
	for i := range pkgs {
		p := &pkgs[i]
		r := rel(p.ImportPath)
		if r == "" {
			continue
		}
		src := append(slices.Clone(p.GoFiles), p.CgoFiles...)
		tests := append(slices.Clone(p.TestGoFiles), p.XTestGoFiles...)
		top := under(r, "cmd") || under(r, "test") || under(r, "examples")
		switch {
		case r == "test/goldendir":
			for _, imp := range p.Imports {
				if !standard(imp) {
					report(p, src, imp, "test/goldendir is a leaf: standard library only, so any package's tests may import it")
				}
			}
		case under(r, "test"):
		case under(r, "examples"):
			for _, imp := range p.Imports {
				if ri := rel(imp); under(ri, "cmd") || under(ri, "test") || under(ri, "internal") || strings.Contains(ri, "/internal") {
					report(p, src, imp, "examples/ use only the library's public packages (nothing under cmd/, test/ or internal/)")
				}
			}
		case under(r, "cmd"):
			cr, ok := cmdRuleFor(r)
			if !ok {
				out = append(out, fmt.Sprintf("%s: no layering rule for this package (add one to test/layering)", r))
			}
			for _, imp := range p.Imports {
				if ri := rel(imp); under(ri, "test") {
					report(p, src, imp, "cmd/ is shipped code and never imports test/")
				} else if r == "cmd/internal/svgplot" && !standard(imp) {
					report(p, src, imp, "cmd/internal/svgplot (the SVG plots of rocev2d congestion) imports only the standard library")
				} else if ok && ri != "" && (under(ri, "cmd") || cr.onlyCmd) && !slices.Contains(cr.ours, ri) {
					report(p, src, imp, cr.why)
				}
			}
		default:
			ru, ok := ruleFor(r)
			if !ok {
				out = append(out, fmt.Sprintf("%s: no layering rule for this package (add one to test/layering)", r))
				break
			}
			for _, imp := range p.Imports {
				if ri := rel(imp); ri != "" && !slices.Contains(ru.ours, ri) && ri != r {
					report(p, src, imp, ru.why)
				}
				for _, b := range ru.banned {
					if imp == b || strings.HasPrefix(imp, b+"/") {
						report(p, src, imp, ru.why)
					}
				}
			}
		}
		if top {
			continue
		}
		for _, imp := range append(slices.Clone(p.TestImports), p.XTestImports...) {
			ri := rel(imp)
			if (under(ri, "cmd") || under(ri, "test")) && ri != "test/goldendir" {
				report(p, tests, imp, "products' tests import nothing under cmd/ or test/ except test/goldendir")
			}
		}
	}
	return out
}

// parsedFile is one Go file with its imports.
type parsedFile struct {
	name    string
	imports []string
	ast     *ast.File
	fset    *token.FileSet
}

// parseFiles parses the named files of p (imports only unless full).
func parseFiles(p *pkg, names []string, full bool) []parsedFile {
	var out []parsedFile
	for _, n := range names {
		fset := token.NewFileSet()
		mode := parser.ImportsOnly
		if full {
			mode = parser.SkipObjectResolution
		}
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, n), nil, mode)
		if err != nil {
			continue
		}
		pf := parsedFile{name: n, ast: f, fset: fset}
		for _, is := range f.Imports {
			if v, err := strconv.Unquote(is.Path.Value); err == nil {
				pf.imports = append(pf.imports, v)
			}
		}
		out = append(out, pf)
	}
	return out
}

// netUses returns the uses of package net other than allowedNet in the
// files, as "file:line: net.Name".
func netUses(dir string, files []parsedFile) []string {
	var out []string
	for _, f := range files {
		name := ""
		for _, is := range f.ast.Imports {
			if is.Path.Value != `"net"` {
				continue
			}
			name = "net"
			if is.Name != nil {
				name = is.Name.Name
			}
		}
		if name == "" {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && !slices.Contains(allowedNet, sel.Sel.Name) {
				pos := f.fset.Position(sel.Pos())
				out = append(out, fmt.Sprintf("%s:%d: net.%s", filepath.ToSlash(filepath.Join(dir, f.name)), pos.Line, sel.Sel.Name))
			}
			return true
		})
	}
	return out
}

// goList runs `go list -e -json ./...` at the module root for goos.
func goList(t *testing.T, root, goos string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json", "./...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GOOS=%s go list: %v\n%s", goos, err, stderr.Bytes())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// moduleRoot returns the directory holding go.mod above the working
// directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", wd)
		}
	}
}

// TestLayering checks every package of the module against the rules in
// the package doc, for linux, darwin and windows, and prints each
// violating import.
func TestLayering(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root := moduleRoot(t)
	seen := map[string]bool{}
	checked := 0
	for _, goos := range []string{"linux", "darwin", "windows"} {
		pkgs := goList(t, root, goos)
		var ok []pkg
		for _, p := range pkgs {
			if p.Error != nil {
				if strings.Contains(p.Error.Err, "build constraints exclude all Go files") {
					continue
				}
				t.Errorf("GOOS=%s %s: %s", goos, p.ImportPath, p.Error.Err)
			}
			ok = append(ok, p)
		}
		files := func(p *pkg, names []string) []parsedFile { return parseFiles(p, names, false) }
		lines := violations(ok, files)
		for _, p := range ok {
			if rel(p.ImportPath) == "transport" {
				for _, u := range netUses("transport", parseFiles(&p, p.GoFiles, true)) {
					lines = append(lines, u+": transport reaches the network only through udp (of package net only "+
						strings.Join(allowedNet, ", ")+")")
				}
			}
		}
		for _, l := range lines {
			if !seen[l] {
				seen[l] = true
				t.Errorf("GOOS=%s: %s", goos, l)
			}
		}
		checked += len(ok)
	}
	if checked == 0 {
		t.Fatal("go list found no packages")
	}
}

// TestViolationsFound: the checker reports each kind of violation, with
// the import that breaks the rule.
func TestViolationsFound(t *testing.T) {
	m := func(r string) string { return module + "/" + r }
	pkgs := []pkg{
		{ImportPath: m("bth"), Imports: []string{"encoding/binary", m("packet")}},
		{ImportPath: m("packet"), Imports: []string{m("bth"), m("rocelayer")}},
		{ImportPath: m("memreg"), Imports: []string{m("aeth"), m("udp")}},
		{ImportPath: m("transport"), Imports: []string{m("udp"), m("memreg"), "golang.org/x/sys/unix", "net"}},
		{ImportPath: m("udp"), Imports: []string{m("icrc")}, TestImports: []string{m("test/golden")},
			XTestImports: []string{m("test/goldendir"), m("transport")}},
		{ImportPath: m("rocelayer"), Imports: []string{m("packet")}, XTestImports: []string{m("cmd/internal/oob")}},
		{ImportPath: m("cmd/rocev2d"), Imports: []string{m("test/faults")}},
		{ImportPath: m("cmd/internal/svgplot"), Imports: []string{"fmt", m("transport")}},
		{ImportPath: m("test/goldendir"), Imports: []string{"os", "github.com/google/gopacket"}},
		{ImportPath: m("test/veth"), TestImports: []string{m("cmd/internal/oob"), m("transport")}},
		{ImportPath: m("newthing"), Imports: []string{"fmt"}},
		{ImportPath: m("udp/faults"), Imports: []string{m("internal/netns"), "github.com/cilium/ebpf"}},
		{ImportPath: m("udp/memnet"), Imports: []string{m("udp"), m("icrc"), m("transport")}},
		{ImportPath: m("examples/x"), Imports: []string{m("rdmacm"), m("cmd/internal/oob")}},
		{ImportPath: m("cmd/internal/demo"), Imports: []string{m("cmd/internal/cli"), m("cmd/internal/pcapcmd"), m("transport")},
			TestImports: []string{m("cmd/internal/clitest"), m("cmd/internal/pcapcmd")}},
		{ImportPath: m("cmd/internal/soak"), Imports: []string{m("cmd/internal/clitest"), m("rdmacm")}},
		{ImportPath: m("cmd/rocev2d"), Imports: []string{m("cmd/internal/cli"), m("cmd/internal/demo"), m("rdmacm")}},
		{ImportPath: m("cmd/internal/oob"), Imports: []string{m("cmd/internal/cli")}},
		{ImportPath: m("cmd/internal/newtool"), Imports: []string{m("cmd/internal/cli")}},
	}
	got := violations(pkgs, nil)
	want := []string{
		"bth imports " + m("packet") + ": wire header packages",
		"packet imports " + m("rocelayer") + ": packet imports only",
		"memreg imports " + m("udp") + ": memreg imports only wire packages",
		"transport imports golang.org/x/sys/unix: transport imports only",
		"udp imports " + m("test/golden") + ": products' tests",
		"rocelayer imports " + m("cmd/internal/oob") + ": products' tests",
		"cmd/rocev2d imports " + m("test/faults") + ": cmd/ is shipped code",
		"cmd/internal/svgplot imports " + m("transport") + ": cmd/internal/svgplot (the SVG plots",
		"test/goldendir imports github.com/google/gopacket: test/goldendir is a leaf",
		"newthing: no layering rule",
		"udp/memnet imports " + m("transport") + ": udp/memnet (the in-memory network) imports only",
		"examples/x imports " + m("cmd/internal/oob") + ": examples/ use only the library's public packages",
		"cmd/internal/demo imports " + m("cmd/internal/pcapcmd") + ": a command package imports under cmd/ only",
		"cmd/internal/soak imports " + m("cmd/internal/clitest") + ": a command package imports under cmd/ only",
		"cmd/rocev2d imports " + m("rdmacm") + ": cmd/rocev2d's main only dispatches",
		"cmd/internal/oob imports " + m("cmd/internal/cli") + ": cmd/internal/oob (shared by the commands) imports nothing under cmd/",
		"cmd/internal/newtool: no layering rule",
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || strings.HasPrefix(g, w)
		}
		if !found {
			t.Errorf("missing violation %q", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}

	// net: only ErrClosed.
	dir := t.TempDir()
	src := "package transport\n\nimport (\n\t\"errors\"\n\tstdnet \"net\"\n)\n\nvar _ = errors.Is(nil, stdnet.ErrClosed)\n\nvar _, _ = stdnet.Dial(\"udp\", \"x\")\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p := pkg{ImportPath: m("transport"), Dir: dir, GoFiles: []string{"x.go"}}
	uses := netUses("transport", parseFiles(&p, p.GoFiles, true))
	if len(uses) != 1 || uses[0] != "transport/x.go:10: net.Dial" {
		t.Errorf("net uses %q, want [transport/x.go:10: net.Dial]", uses)
	}
}

// simulator is the in-memory network, which only tests, simulators and
// cmd/ may pull in.
const simulator = module + "/udp/memnet"

// simulatorFree are the product packages whose non-test dependencies
// (transitively) must not include the simulator: importing the transport
// gives an application the stack, not the test network.
var simulatorFree = []string{"udp", "transport", "rdmacm"}

// withSimulator returns the packages of deps (go list -deps output, one
// import path a line) that are the simulator or below it.
func withSimulator(deps string) []string {
	var out []string
	for d := range strings.FieldsSeq(deps) {
		if d == simulator || strings.HasPrefix(d, simulator+"/") {
			out = append(out, d)
		}
	}
	return out
}

// TestNoSimulatorInProducts: `go list -deps ./transport` (and udp,
// rdmacm) has no udp/memnet, for every GOOS the layering is checked for.
func TestNoSimulatorInProducts(t *testing.T) {
	if got := withSimulator("fmt\n" + simulator + "\n" + module + "/udp\n"); len(got) != 1 {
		t.Fatalf("withSimulator found %q in a list holding the simulator once", got)
	}
	root := moduleRoot(t)
	for _, goos := range []string{"linux", "darwin", "windows"} {
		for _, r := range simulatorFree {
			cmd := exec.Command("go", "list", "-deps", "./"+r)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("GOOS=%s go list -deps ./%s: %v\n%s", goos, r, err, stderr.Bytes())
			}
			if !strings.Contains(string(out), module+"/"+r+"\n") {
				t.Fatalf("GOOS=%s go list -deps ./%s does not list the package itself:\n%s", goos, r, out)
			}
			if got := withSimulator(string(out)); len(got) > 0 {
				t.Errorf("GOOS=%s: %s depends on %v: only tests, simulators and cmd/ may pull in the in-memory network", goos, r, got)
			}
		}
	}
}
