package device

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/edge-agent/edge-agent/internal/failpoint"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// Defaults of HTTPDevice and HTTPOptions.
const (
	DefaultTimeout          = 2 * time.Second
	DefaultRetryWaitMin     = 50 * time.Millisecond
	DefaultRetryWaitMax     = 500 * time.Millisecond
	DefaultMaxResponseBytes = 1 << 20
	maxRetries              = 100
)

// HTTPDevice is the driver configuration of one device that speaks the
// firmware HTTP API of docs/protocol.md §2 (the `driver:` block of a device in
// the agent's configuration).
type HTTPDevice struct {
	// URL is the firmware's base URL, e.g. http://127.0.0.1:8081. Required.
	URL string
	// Timeout bounds each try: connecting, sending and reading the answer.
	// Zero means DefaultTimeout (2s).
	Timeout time.Duration
	// Retries is how many extra tries one write may make, every one with
	// the write's key. Zero means none. Which failures are retried depends
	// on Idempotent.
	Retries int
	// Idempotent declares that the device honours Idempotency-Key (applies
	// a key at most once and answers its repeats with the first answer),
	// so any try that got no definite answer may be retried. False (the
	// zero value) retries only a try that certainly never reached the
	// device: one that could not connect.
	Idempotent bool
	// Queryable declares that the device answers GET .../ops/{key} and
	// tombstones a key it reports unapplied. False (the zero value): Query
	// refuses with ErrNotQueryable, and an unknown write waits for an
	// operator.
	Queryable bool
}

// HTTPOptions configure an HTTP driver. The zero value is usable.
type HTTPOptions struct {
	// Logger receives one debug line per try and a warning per unknown
	// write; nil discards them.
	Logger *slog.Logger
	// Devices are configured as by Add. Nil means none yet.
	Devices map[string]HTTPDevice
	// RetryWaitMin and RetryWaitMax bound the backoff between two tries of
	// one write (doubling from min, capped at max). Zero means 50ms and
	// 500ms.
	RetryWaitMin, RetryWaitMax time.Duration
	// MaxResponseBytes bounds how much of an answer is read. Zero means
	// 1 MiB.
	MaxResponseBytes int64
}

// HTTP is the Driver for devices that speak the firmware HTTP API, built
// on go-retryablehttp. It is safe for concurrent use.
//
// Each write ends in exactly one outcome (docs/design.md, "Talking to a
// device"): a 2xx is Applied, a 4xx Refused; with no definite answer, the
// write is NotSent only if no try could have reached the device (none got
// a connection), and Unknown as soon as one may have (it connected: a
// timeout after sending, a dropped connection, a 5xx), whatever later tries
// did.
type HTTP struct {
	log       *slog.Logger
	transport *http.Transport // one connection per try: devices that do not honour keys
	pooled    *http.Transport // kept-alive connections: devices that do (idempotent)
	waitMin   time.Duration
	waitMax   time.Duration
	maxBody   int64

	mu      sync.RWMutex
	devices map[string]*httpDevice
}

type httpDevice struct {
	cfg    HTTPDevice
	base   string // URL without a trailing slash
	client *http.Client
}

// NewHTTP returns a driver for opts.Devices. It does no I/O.
func NewHTTP(opts HTTPOptions) (*HTTP, error) {
	h := &HTTP{
		log:     opts.Logger,
		waitMin: opts.RetryWaitMin,
		waitMax: opts.RetryWaitMax,
		maxBody: opts.MaxResponseBytes,
		// Keep-alives are off, so every try dials its own connection.
		// That is what makes a try that could not connect certainly
		// unsent, and it keeps net/http from silently resending a POST
		// that carries Idempotency-Key on a fresh connection when a
		// reused one fails (Request.isReplayable): a device that does
		// not honour the key would apply such a resend twice.
		transport: &http.Transport{
			Proxy:                  nil, // devices are reached directly, never through an environment proxy
			DialContext:            (&net.Dialer{KeepAlive: -1}).DialContext,
			DisableKeepAlives:      true,
			TLSHandshakeTimeout:    5 * time.Second,
			MaxResponseHeaderBytes: 64 << 10,
		},
		// A device that honours Idempotency-Key (idempotent: true) may get
		// a try again under the same key, so net/http's own resend on a
		// failed reused connection is harmless, and reusing connections
		// saves a dial per write. A try that got a connection (new or
		// reused) still counts as possibly sent: the four outcomes stay
		// exact.
		pooled: &http.Transport{
			Proxy:                  nil,
			DialContext:            (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:    64,
			IdleConnTimeout:        30 * time.Second,
			TLSHandshakeTimeout:    5 * time.Second,
			MaxResponseHeaderBytes: 64 << 10,
		},
		devices: map[string]*httpDevice{},
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.waitMin <= 0 {
		h.waitMin = DefaultRetryWaitMin
	}
	if h.waitMax <= 0 {
		h.waitMax = DefaultRetryWaitMax
	}
	if h.waitMax < h.waitMin {
		h.waitMax = h.waitMin
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxResponseBytes
	}
	for dev, cfg := range opts.Devices {
		if err := h.Add(dev, cfg); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Add configures one more device. It fails with ErrInvalidConfig or
// ErrDuplicateDevice.
func (h *HTTP) Add(dev string, cfg HTTPDevice) error {
	if dev == "" || strings.Contains(dev, "/") {
		return fmt.Errorf("%w: device ID %q", ErrInvalidConfig, dev)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: device %s: url %q: want http:// or https:// with a host, and no query", ErrInvalidConfig, dev, cfg.URL)
	}
	if cfg.Timeout < 0 {
		return fmt.Errorf("%w: device %s: timeout %v: must not be negative", ErrInvalidConfig, dev, cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Retries < 0 || cfg.Retries > maxRetries {
		return fmt.Errorf("%w: device %s: retries %d: must be 0..%d", ErrInvalidConfig, dev, cfg.Retries, maxRetries)
	}
	tr := h.transport
	if cfg.Idempotent {
		tr = h.pooled
	}
	d := &httpDevice{
		cfg:  cfg,
		base: strings.TrimRight(cfg.URL, "/"),
		client: &http.Client{
			Transport: tr,
			Timeout:   cfg.Timeout,
			// A redirect is an answer of its own (neither 2xx nor 4xx),
			// never a reason to send the write somewhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.devices[dev]; dup {
		return fmt.Errorf("%w: %s", ErrDuplicateDevice, dev)
	}
	h.devices[dev] = d
	return nil
}

// Close closes the driver's idle kept-alive connections. Writes in
// progress are not affected; the driver stays usable.
func (h *HTTP) Close() error {
	h.transport.CloseIdleConnections()
	h.pooled.CloseIdleConnections()
	return nil
}

func (h *HTTP) device(dev string) *httpDevice {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.devices[dev]
}

// Queryable reports the device's queryable setting (false for a device
// not configured).
func (h *HTTP) Queryable(dev string) bool {
	d := h.device(dev)
	return d != nil && d.cfg.Queryable
}

// applyBody is the body of POST /v1/devices/{dev}/apply.
type applyBody struct {
	OpID   string          `json:"op_id"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
}

// Apply sends w to its device: POST {url}/v1/devices/{dev}/apply with
// headers Idempotency-Key (w.Key, on every try) and X-Fence-Token. See
// HTTP for how the outcome is decided. ctx bounds the whole write.
func (h *HTTP) Apply(ctx context.Context, w Write) WriteResult {
	d := h.device(w.Device)
	if d == nil {
		return WriteResult{Outcome: NotSent, Reason: fmt.Sprintf("device %s: %v", w.Device, ErrUnknownDevice)}
	}
	if w.Key == "" {
		return WriteResult{Outcome: NotSent, Reason: "the write has no idempotency key"}
	}
	params := w.Params
	if len(bytes.TrimSpace(params)) == 0 {
		params = json.RawMessage(`{}`)
	}
	body, err := json.Marshal(applyBody{OpID: w.OpID, Action: w.Action, Params: params})
	if err != nil {
		return WriteResult{Outcome: NotSent, Reason: fmt.Sprintf("params are not valid JSON: %v", err)}
	}

	tl := &tryLog{idempotent: d.cfg.Idempotent, timeout: d.cfg.Timeout, log: h.log,
		ids: []any{"device", w.Device, "op_id", w.OpID, "key", w.Key}}
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { tl.connected.Store(true) }}
	if failpoint.Enabled {
		// The request is on the wire and no answer has been read.
		trace.WroteRequest = func(httptrace.WroteRequestInfo) { failpoint.Hit(failpoint.DuringWrite, w.OpID) }
	}
	req, err := retryablehttp.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace),
		http.MethodPost, d.base+"/v1/devices/"+url.PathEscape(w.Device)+"/apply", body)
	if err != nil {
		return WriteResult{Outcome: NotSent, Reason: fmt.Sprintf("build request: %v", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", w.Key)
	req.Header.Set("X-Fence-Token", strconv.FormatInt(w.Fence, 10))

	rc := h.retrying(d, tl.check)
	if w.MayTry != nil {
		rc.PrepareRetry = func(*http.Request) error {
			if !w.MayTry() {
				return errNoMoreTries
			}
			return nil
		}
	}
	resp, err := rc.Do(req)
	res := WriteResult{Tries: tl.tries}
	if resp != nil {
		defer resp.Body.Close()
		data, readErr := h.read(resp.Body)
		switch code := resp.StatusCode; {
		case code >= 200 && code < 300:
			res.Outcome = Applied
			var state json.RawMessage
			if readErr == nil {
				state, readErr = answerState(data)
			}
			if readErr != nil {
				// The device said applied; only the state it reported is lost.
				res.Reason = fmt.Sprintf("applied, but the answer could not be read: %v", readErr)
				h.log.Warn("device applied the write but its answer is unreadable", tl.with("err", readErr)...)
			} else if len(state) > 0 && string(state) != "null" {
				res.State = state
			}
		case code >= 400 && code < 500:
			res.Outcome = Refused
			res.Reason = errorText(resp, data)
		default:
			res.Outcome = Unknown
			res.Reason = "the device answered " + errorText(resp, data)
		}
	} else {
		cause := describe(err, d.cfg.Timeout)
		if tl.mayHaveReached {
			res.Outcome = Unknown
			res.Reason = "may have reached the device: " + tl.firstReach
			if tl.firstReach != cause {
				res.Reason += "; last try: " + cause
			}
		} else {
			res.Outcome = NotSent
			res.Reason = "could not reach the device: " + cause
		}
	}
	if res.Tries > 1 && res.Outcome != Applied {
		res.Reason = fmt.Sprintf("%s (%d tries)", res.Reason, res.Tries)
	}
	if errors.Is(err, errNoMoreTries) {
		res.Reason += "; " + errNoMoreTries.Error()
	}
	if res.Outcome == Unknown {
		h.log.Warn("device write outcome unknown", tl.with("reason", res.Reason, "tries", res.Tries)...)
	} else if h.log.Enabled(ctx, slog.LevelDebug) {
		h.log.Debug("device write", tl.with("outcome", res.Outcome.String(), "reason", res.Reason, "tries", res.Tries)...)
	}
	return res
}

// errNoMoreTries ends a write whose Write.MayTry said no before a retry.
var errNoMoreTries = errors.New("no further try: the write may no longer be sent (Write.MayTry)")

// answerState reads the state of an apply answer ({"applied":true,
// "state":{...}}): with the project's scanner when it can be sure, else
// with encoding/json (one reflective decode per write was a visible cost).
func answerState(data []byte) (json.RawMessage, error) {
	if st, ok := jsonscan.Member(data, "state", 1000); ok {
		return bytes.Clone(st), nil
	}
	var a struct {
		State json.RawMessage `json:"state"`
	}
	err := json.Unmarshal(data, &a)
	return a.State, err
}

// tryLog follows the tries of one write. The GotConn trace marks a try that
// obtained a connection: only such a try can have put bytes on the wire,
// so a try without one certainly did not reach the device.
type tryLog struct {
	idempotent     bool
	timeout        time.Duration
	log            *slog.Logger
	ids            []any       // device, op_id, key: added to each line (a logger With them costs on every write)
	connected      atomic.Bool // the current try got a connection
	tries          int
	mayHaveReached bool
	firstReach     string // why the first try that may have reached the device has no answer
}

// check is the CheckRetry of one write, called once after each try.
func (t *tryLog) check(ctx context.Context, resp *http.Response, err error) (bool, error) {
	t.tries++
	reached := t.connected.Swap(false) || resp != nil
	definite := resp != nil && resp.StatusCode >= 200 && resp.StatusCode < 500 && (resp.StatusCode < 300 || resp.StatusCode >= 400)
	if reached && !definite && !t.mayHaveReached {
		t.mayHaveReached = true
		if resp != nil {
			t.firstReach = "HTTP " + strconv.Itoa(resp.StatusCode)
		} else {
			t.firstReach = describe(err, t.timeout)
		}
	}
	// Retry only what cannot apply twice: nothing after a definite answer;
	// for a device that honours keys anything else (the retry reuses the
	// key); otherwise only a try that never got a connection.
	retry := !definite && ctx.Err() == nil && (t.idempotent || !reached)
	if t.log.Enabled(ctx, slog.LevelDebug) {
		attrs := t.with("try", t.tries, "reached", reached, "retryable", retry)
		if resp != nil {
			attrs = append(attrs, "status", resp.StatusCode)
		}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		t.log.Debug("device try", attrs...)
	}
	return retry, nil
}

// with returns the write's ids followed by attrs, for one log line.
func (t *tryLog) with(attrs ...any) []any {
	return append(append(make([]any, 0, len(t.ids)+len(attrs)+4), t.ids...), attrs...)
}

// retrying returns a retryablehttp client for one call on d. It is cheap:
// the connections live in the shared transport.
func (h *HTTP) retrying(d *httpDevice, check retryablehttp.CheckRetry) *retryablehttp.Client {
	return &retryablehttp.Client{
		HTTPClient:   d.client,
		RetryWaitMin: h.waitMin,
		RetryWaitMax: h.waitMax,
		RetryMax:     d.cfg.Retries,
		CheckRetry:   check,
		// Exponential from min to max; a device's Retry-After is ignored,
		// so one write never waits longer than the configured bound.
		Backoff: func(min, max time.Duration, attempt int, _ *http.Response) time.Duration {
			return retryablehttp.DefaultBackoff(min, max, attempt, nil)
		},
		// Give back the last answer (e.g. the 503) or error as they are:
		// Apply classifies them.
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
}

// Query asks the device whether the write with key was applied: GET
// {url}/v1/devices/{dev}/ops/{key}. 200 with "applied": true is applied
// (with the state the device reports); 404 with "applied": false is not
// applied, and the device has tombstoned the key. Any other 404 (no JSON
// body, or one without "applied": false, such as the firmware's answer for
// a device it does not know) is not a tombstone: it is
// ErrUnexpectedStatus, as is any other status. A transport error is
// returned wrapped. Tries that fail without an answer or with a 5xx are
// retried up to the device's Retries (a query is safe to repeat). ctx
// bounds the whole query.
func (h *HTTP) Query(ctx context.Context, dev, key string) (QueryResult, error) {
	d := h.device(dev)
	if d == nil {
		return QueryResult{}, fmt.Errorf("device %s: %w", dev, ErrUnknownDevice)
	}
	if !d.cfg.Queryable {
		return QueryResult{}, fmt.Errorf("device %s: %w", dev, ErrNotQueryable)
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodGet,
		d.base+"/v1/devices/"+url.PathEscape(dev)+"/ops/"+url.PathEscape(key), nil)
	if err != nil {
		return QueryResult{}, fmt.Errorf("device %s: query %s: %w", dev, key, err)
	}
	resp, err := h.retrying(d, func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		return ctx.Err() == nil && (err != nil || resp.StatusCode >= 500), nil
	}).Do(req)
	if resp == nil {
		return QueryResult{}, fmt.Errorf("device %s: query %s: %s: %w", dev, key, describe(err, d.cfg.Timeout), err)
	}
	defer resp.Body.Close()
	data, readErr := h.read(resp.Body)
	var a struct {
		Applied *bool           `json:"applied"`
		State   json.RawMessage `json:"state"`
		Error   string          `json:"error"`
	}
	parseErr := readErr
	if parseErr == nil && len(bytes.TrimSpace(data)) > 0 {
		parseErr = json.Unmarshal(data, &a)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if parseErr != nil || a.Applied == nil || !*a.Applied {
			return QueryResult{}, fmt.Errorf("device %s: query %s: 200 without applied:true (%v): %w", dev, key, parseErr, ErrBadResponse)
		}
		qr := QueryResult{Applied: true}
		if len(a.State) > 0 && string(a.State) != "null" {
			qr.State = a.State
		}
		return qr, nil
	case http.StatusNotFound:
		// Only the explicit answer is a tombstone: a plain 404 (a device
		// without the ops route, a wrong base URL, a proxy's page) says
		// nothing about the key, and reading it as "not applied" would
		// send the operation again under a new key: a possible second
		// apply (invariant 2).
		if parseErr == nil && a.Applied != nil && !*a.Applied {
			return QueryResult{Applied: false}, nil
		}
		return QueryResult{}, fmt.Errorf(`device %s: query %s: 404 without "applied": false (%s), not a tombstone: %w`, dev, key, errorText(resp, data), ErrUnexpectedStatus)
	}
	return QueryResult{}, fmt.Errorf("device %s: query %s: %s: %w", dev, key, errorText(resp, data), ErrUnexpectedStatus)
}

// read reads at most maxBody bytes of an answer.
func (h *HTTP) read(body io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(body, h.maxBody+1))
	if err == nil && int64(len(data)) > h.maxBody {
		return data[:h.maxBody], fmt.Errorf("answer larger than %d bytes", h.maxBody)
	}
	return data, err
}

// errorText is an answer as a short sentence: the "error" of its JSON body
// when it has one, else its status.
func errorText(resp *http.Response, body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			return e.Error
		}
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, e.Error)
	}
	return "HTTP " + resp.Status
}

// describe says why a try got no answer.
func describe(err error, timeout time.Duration) string {
	var ne net.Error
	switch {
	case err == nil:
		return "no answer"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		if timeout > 0 {
			return fmt.Sprintf("no answer within %v", timeout)
		}
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed without an answer"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}
