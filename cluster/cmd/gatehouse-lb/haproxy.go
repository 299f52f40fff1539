package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// haproxy runs one haproxy in master-worker mode and keeps it serving a set of frontends.
//
// Files in the state dir: haproxy.cfg (what the current worker runs), haproxy.pid (the
// master), master.sock (master CLI: reload, show proc, and `@1 <command>` to reach the
// current worker), haproxy.sock (the worker's stats/runtime socket, level admin, with
// expose-fd listeners so that a reload hands the listening sockets over).
type haproxy struct {
	bin        string
	dir        string
	cfgPath    string
	pidPath    string
	masterSock string
	statsSock  string

	cmd    *exec.Cmd
	exited chan struct{} // closed when the master exits; nil when not started

	// running is what the current worker serves, slot by slot (nil: not running).
	running map[string]*frontend
	// listenErr holds the frontends left out because their address could not be bound.
	listenErr map[string]error
}

// The longest path a unix socket address can carry on Linux.
const maxSocketPath = 107

func newHAProxy(bin, dir string) (*haproxy, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("--haproxy: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	h := &haproxy{
		bin:        path,
		dir:        dir,
		cfgPath:    filepath.Join(dir, "haproxy.cfg"),
		pidPath:    filepath.Join(dir, "haproxy.pid"),
		masterSock: filepath.Join(dir, "master.sock"),
		statsSock:  filepath.Join(dir, "haproxy.sock"),
		listenErr:  map[string]error{},
	}
	if len(h.masterSock) > maxSocketPath || len(h.statsSock) > maxSocketPath {
		return nil, fmt.Errorf("--state-dir %s is too long for a unix socket path (at most %d bytes with the socket name)", dir, maxSocketPath)
	}
	return h, nil
}

func (h *haproxy) isRunning() bool {
	if h.exited == nil {
		return false
	}
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// exitedC is closed when the running master exits (nil when none runs: blocks forever).
func (h *haproxy) exitedC() <-chan struct{} {
	if !h.isRunning() {
		return nil
	}
	return h.exited
}

// serving says whether the current worker serves the frontend.
func (h *haproxy) serving(name string) bool {
	_, ok := h.running[name]
	return ok
}

// apply makes haproxy serve want. Endpoint changes of existing frontends go through the
// runtime API; anything else (a frontend added or removed, a backend that needs more
// slots, a change of balancing) rewrites the configuration and reloads seamlessly. It fills
// in want[*].slots. Frontends whose address cannot be bound are left out (h.listenErr) so
// that one bad Service does not stop the others.
func (h *haproxy) apply(want map[string]*frontend) error {
	if !h.isRunning() {
		h.running = nil
		h.stopStale() // before probing: a master left by a killed run would hold the addresses
	}
	// Addresses the current worker listens on need no probe (haproxy hands a listening
	// socket over by address, even to a frontend of another name).
	bound := map[netip.AddrPort]bool{}
	for _, r := range h.running {
		bound[r.bind] = true
	}
	include := map[string]*frontend{}
	for name, w := range want {
		var prev []slot
		r, ok := h.running[name]
		switch {
		case ok && r.bind == w.bind:
			prev = r.slots
		case bound[w.bind]:
			// Another frontend's address (a Service deleted and another given its
			// address in one go): fresh slots, no probe.
		default:
			if err := probeListen(w.bind); err != nil {
				if h.listenErr[name] == nil || h.listenErr[name].Error() != err.Error() {
					log.Printf("%s: cannot listen on %s, leaving this port out: %v", w.service, w.bind, err)
				}
				h.listenErr[name] = err
				continue
			}
		}
		delete(h.listenErr, name)
		w.slots = planSlots(prev, w.want)
		include[name] = w
	}
	for name := range h.listenErr {
		if _, ok := want[name]; !ok {
			delete(h.listenErr, name)
		}
	}

	if h.running == nil {
		return h.start(include)
	}
	if sameShape(h.running, include) {
		err := h.applyRuntime(include)
		if err == nil {
			return nil
		}
		log.Printf("runtime API update failed (%v); reloading with the full configuration instead", err)
	}
	return h.reload(include)
}

// applyRuntime sends the endpoint changes to the current worker, backend by backend.
func (h *haproxy) applyRuntime(want map[string]*frontend) error {
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		w, r := want[name], h.running[name]
		cmds := runtimeCommands(name, r.slots, w.slots)
		for _, c := range cmds {
			if err := h.runtimeCmd(c); err != nil {
				return fmt.Errorf("%s: %w", c, err)
			}
		}
		if len(cmds) > 0 {
			log.Printf("%s: %d endpoint(s) %s (runtime API: %d command(s), no reload)", w.service, len(w.want), describe(w), len(cmds))
		}
		h.running[name] = w
	}
	return nil
}

func describe(f *frontend) string {
	parts := make([]string, len(f.want))
	for i, a := range f.want {
		parts[i] = a.String()
	}
	return fmt.Sprintf("on %s -> [%s]", f.bind, strings.Join(parts, " "))
}

// runtimeCmd runs one command on the current worker through the master CLI (`@1`: the
// current worker, never one that is finishing its connections after a reload).
func (h *haproxy) runtimeCmd(cmd string) error {
	out, err := h.cli("@1 "+cmd, 5*time.Second)
	if err != nil {
		return err
	}
	out = strings.TrimSpace(out)
	switch {
	case out == "",
		strings.HasPrefix(out, "IP changed"),
		strings.HasPrefix(out, "port changed"),
		strings.HasPrefix(out, "no need to change"):
		return nil
	}
	return errors.New(out)
}

// start starts haproxy on a fresh configuration and waits for its first worker.
func (h *haproxy) start(fes map[string]*frontend) error {
	h.stopStale()
	cfg := renderConfig(h.statsSock, fes)
	if err := h.writeConfig(cfg); err != nil {
		return err
	}
	_ = os.Remove(h.masterSock)
	_ = os.Remove(h.statsSock)

	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(h.bin, "-W", "-S", h.masterSock+",mode,600", "-f", h.cfgPath, "-p", h.pidPath)
	cmd.Stdout, cmd.Stderr = pw, pw
	// Its own process group: a Ctrl-C in a terminal reaches gatehouse-lb, which stops
	// haproxy itself. Pdeathsig: if gatehouse-lb dies (even SIGKILL), so does haproxy.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		// The "parent" of Pdeathsig is the thread that forked: keep it alive (locked,
		// never unlocked) for as long as haproxy runs.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		log.Printf("haproxy master (pid %d) exited: %v", cmd.Process.Pid, exitText(err))
		close(exited)
	}()
	err = <-started
	pw.Close()
	if err != nil {
		pr.Close()
		return fmt.Errorf("starting haproxy: %w", err)
	}
	go copyLog(pr)
	h.cmd, h.exited = cmd, exited

	deadline := time.Now().Add(15 * time.Second)
	for {
		if !h.isRunning() {
			return errors.New("haproxy exited during start (its log above says why)")
		}
		if p, err := h.showProc(); err == nil && len(p.workers) > 0 {
			log.Printf("haproxy running: master pid %d, worker pid %d, %d frontend(s)", cmd.Process.Pid, p.workers[0], len(fes))
			break
		}
		if time.Now().After(deadline) {
			h.stop()
			return errors.New("haproxy started no worker within 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.running = fes
	return nil
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// logNoise are haproxy messages every reload repeats (two lines per proxy from the old
// worker, the version banner from the master); everything else is passed on.
var logNoise = []string{"stopped (cumulated conns:", "haproxy version is", "path to executable is"}

func copyLog(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
next:
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " ")
		for _, n := range logNoise {
			if strings.Contains(line, n) {
				continue next
			}
		}
		if line != "" {
			log.Printf("haproxy: %s", line)
		}
	}
}

// writeConfig checks a configuration with `haproxy -c` and then puts it in place.
func (h *haproxy) writeConfig(cfg string) error {
	tmp := h.cfgPath + ".new"
	if err := os.WriteFile(tmp, []byte(cfg), 0o600); err != nil {
		return err
	}
	out, err := exec.Command(h.bin, "-c", "-q", "-f", tmp).CombinedOutput()
	if err != nil {
		return fmt.Errorf("haproxy -c rejected the generated configuration (kept as %s): %v: %s", tmp, err, bytes.TrimSpace(out))
	}
	return os.Rename(tmp, h.cfgPath)
}

// reload rewrites the configuration and asks the master for a seamless reload: the new
// worker takes over the listening sockets (no connection refused in between), the old one
// stops accepting and exits once its last established connection has finished.
func (h *haproxy) reload(fes map[string]*frontend) error {
	old, _ := os.ReadFile(h.cfgPath)
	if err := h.writeConfig(renderConfig(h.statsSock, fes)); err != nil {
		return err
	}
	restore := func() { _ = os.WriteFile(h.cfgPath, old, 0o600) }
	before, err := h.showProc()
	if err != nil {
		restore()
		return fmt.Errorf("master CLI: %w", err)
	}
	start := time.Now()
	// The master closes the connection when it re-executes itself; the answer is in
	// `show proc` afterwards.
	_, _ = h.cli("reload", 5*time.Second)
	deadline := start.Add(30 * time.Second)
	for {
		time.Sleep(50 * time.Millisecond)
		if !h.isRunning() {
			return errors.New("haproxy exited during a reload (its log above says why)")
		}
		p, err := h.showProc()
		if err == nil && p.reloads > before.reloads {
			if p.failed > before.failed {
				restore()
				_ = os.WriteFile(h.cfgPath+".failed", []byte(renderConfig(h.statsSock, fes)), 0o600)
				return fmt.Errorf("haproxy could not load the new configuration (kept as %s.failed; its log above says why); the previous one still serves", h.cfgPath)
			}
			if pid, ok := newWorker(before.workers, p.workers); ok {
				log.Printf("haproxy reloaded in %s: %d frontend(s), new worker pid %d, %d older worker(s) finishing their connections",
					time.Since(start).Round(time.Millisecond), len(fes), pid, len(p.old))
				h.running = fes
				return nil
			}
		}
		if time.Now().After(deadline) {
			restore()
			return errors.New("haproxy did not finish a reload within 30s")
		}
	}
}

func newWorker(before, after []int) (int, bool) {
	for _, p := range after {
		if !slices.Contains(before, p) {
			return p, true
		}
	}
	return 0, false
}

// stop stops haproxy: SIGTERM to the master, which stops every worker (current and old)
// at once; SIGKILL after 10 s.
func (h *haproxy) stop() {
	if h.isRunning() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(10 * time.Second):
			log.Printf("haproxy did not stop on SIGTERM within 10s; killing it")
			_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.exited
		}
	}
	h.running = nil
	_ = os.Remove(h.pidPath)
	_ = os.Remove(h.masterSock)
	_ = os.Remove(h.statsSock)
}

// stopStale stops a master left by an earlier gatehouse-lb of this state dir that could
// not stop it (its pid file names it and its command line names our configuration).
func (h *haproxy) stopStale() {
	b, err := os.ReadFile(h.pidPath)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(h.cfgPath)) {
		return
	}
	log.Printf("stopping haproxy master pid %d left by an earlier run", pid)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 100; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// cli sends one command to the master CLI and returns the answer. The master CLI answers
// once the client has half-closed the connection.
func (h *haproxy) cli(cmd string, timeout time.Duration) (string, error) {
	conn, err := net.DialTimeout("unix", h.masterSock, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte(cmd + "\n")); err != nil {
		return "", err
	}
	if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
		return "", err
	}
	out, err := io.ReadAll(conn)
	return string(out), err
}

type procInfo struct {
	reloads, failed int
	workers, old    []int
}

var masterLine = regexp.MustCompile(`^\d+\s+master\s+(\d+)(?:\s+\[failed:\s*(\d+)\])?`)

func (h *haproxy) showProc() (procInfo, error) {
	out, err := h.cli("show proc", 2*time.Second)
	if err != nil {
		return procInfo{}, err
	}
	return parseShowProc(out)
}

// parseShowProc reads the master CLI's `show proc` (haproxy 2.5+):
//
//	#<PID>          <type>          <reloads>       <uptime>        <version>
//	30820           master          4 [failed: 1]   0d00h11m03s     2.6.12
//	# workers
//	21175           worker          1               0d00h00m11s     2.6.12
//	# old workers
//	21043           worker          2               0d00h00m20s     2.6.12
//	# programs
func parseShowProc(out string) (procInfo, error) {
	var p procInfo
	section := ""
	sawMaster := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#<"):
			continue
		case strings.HasPrefix(line, "#"):
			section = strings.TrimSpace(strings.TrimPrefix(line, "#"))
			continue
		}
		if m := masterLine.FindStringSubmatch(line); m != nil {
			p.reloads, _ = strconv.Atoi(m[1])
			if m[2] != "" {
				p.failed, _ = strconv.Atoi(m[2])
			}
			sawMaster = true
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != "worker" {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		switch section {
		case "workers":
			p.workers = append(p.workers, pid)
		case "old workers":
			p.old = append(p.old, pid)
		}
	}
	if !sawMaster {
		return p, fmt.Errorf("unexpected `show proc` answer: %q", out)
	}
	return p, nil
}

// probeListen checks that an address can be listened on before haproxy is asked to: a
// frontend haproxy cannot bind would make the whole reload fail. (A plain listen, without
// SO_REUSEPORT, also refuses an address another haproxy already serves, which haproxy
// itself would share.)
func probeListen(a netip.AddrPort) error {
	l, err := net.Listen("tcp", a.String())
	if err != nil {
		return err
	}
	return l.Close()
}
