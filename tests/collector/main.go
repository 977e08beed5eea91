// krabka-collector: the OpenTelemetry Collector's own OTLP receiver, alone, as the
// tests' judge of what krabka-pprof pushes as OTLP profiles.
//
// It runs the Collector's otlpreceiver (HTTP only, no gRPC) in this process, with a
// consumer that writes every profiles request it is handed to DIR as
// req-NNNN.pb (ProfilesData, pprofile.ProtoMarshaler) and then req-NNNN.json
// (pprofile.JSONMarshaler), N counting from 1, each file written under a temporary
// name and renamed, so that a reader never sees half a file; it accepts every request.
// What it writes is what the receiver decoded, marshalled again by pdata: not the
// bytes on the wire.
//
// The receiver answers a request whose profiles hold no sample (SampleCount() == 0)
// with 200 without handing it to the consumer: no file is written for it.
//
// Usage: krabka-collector -dir DIR
//
// Once the receiver listens, it prints one line, addr=127.0.0.1:PORT, to stdout. It
// runs until its stdin is closed (or reaches EOF) or it gets SIGTERM or SIGINT, then
// shuts the receiver down (letting requests in flight finish) and exits 0. On any
// error it says what went wrong on stderr and exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"
)

func main() {
	flags := flag.NewFlagSet("krabka-collector", flag.ContinueOnError)
	dir := flags.String("dir", "", "directory to write each received request to (req-NNNN.pb, req-NNNN.json); created if missing")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fail("usage: krabka-collector -dir DIR")
	}
	if *dir == "" || flags.NArg() != 0 {
		fail("usage: krabka-collector -dir DIR")
	}
	if err := run(*dir); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintf(os.Stderr, "krabka-collector: %s\n", msg)
	os.Exit(1)
}

func run(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create the directory %s: %w", dir, err)
	}

	writer := &requestWriter{dir: dir}
	next, err := xconsumer.NewProfiles(writer.consume)
	if err != nil {
		return fmt.Errorf("cannot create the consumer: %w", err)
	}

	factory, ok := otlpreceiver.NewFactory().(xreceiver.Factory)
	if !ok {
		return errors.New("the otlpreceiver factory does not create profiles receivers (it is not an xreceiver.Factory)")
	}
	cfg, ok := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	if !ok {
		return errors.New("the otlpreceiver's default config is not an *otlpreceiver.Config")
	}
	// HTTP only. The defaults are configoptional.Default values, which count as absent
	// until made present: GetOrInsertDefault turns HTTP's into Some, keeping its defaults.
	cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	httpCfg := cfg.Protocols.HTTP.GetOrInsertDefault()
	// Port 0: the kernel picks a free port, which no other process can take between
	// our choosing it and the receiver's listening on it. The receiver does not return
	// its listener; it logs the address it bound ("Starting HTTP server", field
	// "endpoint"), which the logger below captures.
	httpCfg.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"

	bound := &boundAddr{}
	set := receivertest.NewNopSettings(factory.Type())
	set.Logger = zap.New(zapcore.NewTee(
		// The receiver's warnings and errors, on stderr.
		zapcore.NewCore(
			zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
			zapcore.Lock(os.Stderr),
			zapcore.WarnLevel,
		),
		&addrCapture{bound: bound},
	))

	rcv, err := factory.CreateProfiles(context.Background(), set, cfg, next)
	if err != nil {
		return fmt.Errorf("cannot create the OTLP profiles receiver: %w", err)
	}
	host := &statusHost{fatal: make(chan error, 1)}
	if err := rcv.Start(context.Background(), host); err != nil {
		return fmt.Errorf("cannot start the OTLP receiver on %s: %w", httpCfg.ServerConfig.NetAddr.Endpoint, err)
	}
	addr := bound.get()
	if addr == "" {
		_ = rcv.Shutdown(context.Background())
		return errors.New(`the OTLP receiver started without logging the address it listens on ("Starting HTTP server" with an "endpoint" field): has otlpreceiver changed?`)
	}
	if _, err := fmt.Fprintf(os.Stdout, "addr=%s\n", addr); err != nil {
		_ = rcv.Shutdown(context.Background())
		return fmt.Errorf("cannot write the address to stdout: %w", err)
	}
	_ = os.Stdout.Sync() // os.Stdout is unbuffered; Sync fails on a pipe, harmlessly.

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	var runErr error
	select {
	case <-stdinClosed:
	case <-signals:
	case err := <-host.fatal:
		runErr = fmt.Errorf("the OTLP receiver failed: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rcv.Shutdown(ctx); err != nil && runErr == nil {
		runErr = fmt.Errorf("cannot shut the OTLP receiver down: %w", err)
	}
	if err := writer.failure(); err != nil && runErr == nil {
		runErr = fmt.Errorf("not every request was recorded, the first failure: %w", err)
	}
	return runErr
}

// requestWriter is the consumer: it writes each request to two files, in the order
// the requests reach it.
type requestWriter struct {
	dir string

	mu    sync.Mutex
	count int
	err   error // the first write that failed
}

func (w *requestWriter) consume(_ context.Context, pd pprofile.Profiles) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.count++
	base := filepath.Join(w.dir, fmt.Sprintf("req-%04d", w.count))

	// Both marshalers rewrite the data they are given (resource and scope attributes
	// become string table references) unless it is read-only: marshal a copy, so the
	// consumer leaves what the receiver handed it as it was.
	data := pprofile.NewProfiles()
	pd.CopyTo(data)

	pb, err := (&pprofile.ProtoMarshaler{}).MarshalProfiles(data)
	if err == nil {
		err = writeFile(base+".pb", pb)
	}
	if err == nil {
		var js []byte
		js, err = (&pprofile.JSONMarshaler{}).MarshalProfiles(data)
		if err == nil {
			err = writeFile(base+".json", js)
		}
	}
	if err != nil {
		err = fmt.Errorf("cannot record request %d: %w", w.count, err)
		fmt.Fprintf(os.Stderr, "krabka-collector: %s\n", err)
		if w.err == nil {
			w.err = err
		}
		// Permanent: the receiver answers 500, and the sender does not retry.
		return consumererror.NewPermanent(err)
	}
	return nil
}

func (w *requestWriter) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// writeFile writes data to path through a temporary file in the same directory,
// renamed into place once complete.
func writeFile(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// boundAddr holds the address the receiver's HTTP server listens on, once logged.
type boundAddr struct {
	mu   sync.Mutex
	addr string
}

func (b *boundAddr) set(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.addr == "" {
		b.addr = addr
	}
}

func (b *boundAddr) get() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addr
}

// addrCapture is a zap core that keeps nothing but the "endpoint" field of the
// receiver's "Starting HTTP server" entry: the address its listener got.
type addrCapture struct {
	bound *boundAddr
}

func (c *addrCapture) Enabled(zapcore.Level) bool        { return true }
func (c *addrCapture) With([]zapcore.Field) zapcore.Core { return c }
func (c *addrCapture) Sync() error                       { return nil }

func (c *addrCapture) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "Starting HTTP server" {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *addrCapture) Write(e zapcore.Entry, fields []zapcore.Field) error {
	for _, f := range fields {
		if f.Key != "endpoint" || f.Type != zapcore.StringType {
			continue
		}
		if _, _, err := net.SplitHostPort(f.String); err == nil {
			c.bound.set(f.String)
		}
	}
	return nil
}

// statusHost is the receiver's host: no extensions, and a fatal error the receiver
// reports (its HTTP server stopped serving) ends the run.
type statusHost struct {
	fatal chan error
}

var (
	_ component.Host           = (*statusHost)(nil)
	_ componentstatus.Reporter = (*statusHost)(nil)
)

func (h *statusHost) GetExtensions() map[component.ID]component.Component {
	return map[component.ID]component.Component{}
}

func (h *statusHost) Report(ev *componentstatus.Event) {
	if ev.Status() != componentstatus.StatusFatalError {
		return
	}
	select {
	case h.fatal <- ev.Err():
	default:
	}
}
