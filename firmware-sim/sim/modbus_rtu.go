package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The Modbus RTU-over-TCP face of the simulator (docs/protocol.md §11): RTU
// frames (unit ID, PDU, CRC-16/MODBUS low byte first; no MBAP header) on a
// TCP stream, as a serial device server passes on a serial line's bytes.
// The library (simonvetter/modbus) has a client for this but no server, so
// each connection is bridged: a request frame is checked (its CRC, its
// unit), re-framed as Modbus TCP and sent over a loopback connection to a
// private library server with the TCP listener's handler (mbHandler), and
// the answer is re-framed as RTU. The register map, the journal and the
// faults are the TCP listener's by construction. What is RTU's own is
// done here:
//
//   - RTU has no length field: a request's length follows from its
//     function code (8 bytes for 01..06; 9 + its byte count for 0F and
//     10). Any other function code is read until the stream goes quiet
//     for rtuQuiet and, if its CRC is good, answered exception 01 (illegal
//     function), as the TCP listener answers it.
//   - A frame with a bad CRC is not answered, as a serial device would
//     not answer it; the bytes its function code says it has are dropped.
//   - A frame for a unit no device has is not answered: on a serial line
//     nobody answers it, and the client times out (the TCP listener, a
//     gateway, answers exception 0B instead). Broadcast (unit 0) is not
//     simulated: it is dropped unapplied.
//   - When the simulator closes a connection without answering (hang once
//     cleared, reset_rate, drop_response_rate, a malformed request), the
//     client's connection is closed.
//
// Requests of one connection are handled one at a time, in order, as on a
// serial line: a request sent after its client gave up on the previous
// one is read only once that one is answered, and the late answer is sent
// first (RTU carries no transaction ID to tell them apart).

const (
	// rtuMaxRequest is the longest request frame read: write multiple
	// coils or registers with a byte count of 255 (the library's server
	// refuses more than 246 and closes the connection).
	rtuMaxRequest = 9 + 255
	// rtuFrameTime bounds the wait for the rest of a frame once its first
	// bytes arrived; a client that stops mid-frame is disconnected.
	rtuFrameTime = time.Second
	// rtuQuiet ends a frame of a function code the simulator does not
	// serve (its length is unknown): what arrives until the stream has
	// been quiet this long, as t3.5 ends a frame on a serial line.
	rtuQuiet = 20 * time.Millisecond
	// rtuWriteTime bounds writing an answer (or a request to the private
	// server).
	rtuWriteTime = 10 * time.Second
)

// rtuServer is StartModbusRTU's listener and its bridges. Close (close)
// closes the listener and every connection, and waits for its goroutines.
type rtuServer struct {
	s           *Sim
	ln          net.Listener
	backendAddr string
	wg          sync.WaitGroup // the accept loop and one per client connection

	mu      sync.Mutex
	closed  bool
	clients int                   // client connections being served (at most maxModbusClients)
	conns   map[net.Conn]struct{} // client and private-server connections, closed by close
}

// StartModbusRTU serves the simulated devices over Modbus RTU-over-TCP on
// addr (host:port; port 0 picks a free one) until Close: the same
// hardware, unit IDs, journal and faults as StartModbus's Modbus TCP, with
// RTU's framing and silences (docs/protocol.md §11). Open (the journal) is
// done first. It may be called once, with or without StartModbus and
// Start.
func (s *Sim) StartModbusRTU(addr string) error {
	if err := s.Open(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.rtu != nil:
		return ErrStarted
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: modbus RTU-over-TCP listen on %s: %w", addr, err)
	}
	backend, baddr, err := s.listenModbus("127.0.0.1", "0")
	if err != nil {
		ln.Close()
		return fmt.Errorf("sim: modbus RTU-over-TCP: its private Modbus TCP server: %w", err)
	}
	r := &rtuServer{s: s, ln: ln, backendAddr: baddr, conns: map[net.Conn]struct{}{}}
	s.rtu, s.rtuBackend = r, backend
	r.wg.Add(1)
	go r.accept()
	s.log.Info("modbus RTU-over-TCP listening", "addr", ln.Addr().String(), "units", s.unitList())
	return nil
}

// ModbusRTUAddr is the address StartModbusRTU listens on, "" before.
func (s *Sim) ModbusRTUAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rtu == nil {
		return ""
	}
	return s.rtu.ln.Addr().String()
}

// close stops accepting, closes every connection (a bridge waiting for a
// held answer gives up) and waits for the bridges to end.
func (r *rtuServer) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

// track registers c to be closed by close; false (c not registered) once
// closed, or for a client beyond maxModbusClients.
func (r *rtuServer) track(c net.Conn, client bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || client && r.clients >= maxModbusClients {
		return false
	}
	if client {
		r.clients++
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *rtuServer) untrack(c net.Conn, client bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if client {
		r.clients--
	}
	delete(r.conns, c)
}

func (r *rtuServer) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors, say: wait a moment (or for Close).
			r.s.log.Warn("modbus RTU-over-TCP: accept failed", "err", err)
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-t.C:
			case <-r.s.closing:
				t.Stop()
			}
			continue
		}
		if !r.track(c, true) {
			r.s.log.Warn("modbus RTU-over-TCP: connection refused: closing, or too many clients", "client", c.RemoteAddr().String(), "max", maxModbusClients)
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.untrack(c, true)
			defer c.Close()
			if err := r.bridge(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				r.s.log.Debug("modbus RTU-over-TCP: connection closed", "client", c.RemoteAddr().String(), "reason", err)
			}
		}()
	}
}

// bridge serves one client connection until either side closes it.
func (r *rtuServer) bridge(c net.Conn) error {
	b, err := net.DialTimeout("tcp", r.backendAddr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial the private Modbus TCP server %s: %w", r.backendAddr, err)
	}
	defer b.Close()
	if !r.track(b, false) {
		return net.ErrClosed
	}
	defer r.untrack(b, false)
	buf := make([]byte, rtuMaxRequest)
	var txn uint16
	for {
		frame, err := readRTURequest(c, buf)
		if err != nil {
			return err
		}
		if len(frame) < 4 || crc16(frame[:len(frame)-2]) != binary.LittleEndian.Uint16(frame[len(frame)-2:]) {
			r.s.log.Debug("modbus RTU-over-TCP: bad CRC, not answered", "client", c.RemoteAddr().String(), "frame", fmt.Sprintf("% x", frame))
			continue
		}
		unit, pdu := frame[0], frame[1:len(frame)-2]
		if unit == 0 || r.s.units[unit] == nil { // units is fixed by New
			r.s.log.Debug("modbus RTU-over-TCP: no device has this unit, not answered", "unit", unit)
			continue
		}
		var answer []byte
		if rtuServed(pdu[0]) {
			txn++
			if answer, err = r.forward(b, txn, unit, pdu); err != nil {
				return err
			}
		} else {
			answer = []byte{unit, pdu[0] | 0x80, 0x01} // illegal function
		}
		answer = binary.LittleEndian.AppendUint16(answer, crc16(answer))
		c.SetWriteDeadline(time.Now().Add(rtuWriteTime))
		if _, err := c.Write(answer); err != nil {
			return fmt.Errorf("write the answer: %w", err)
		}
	}
}

// forward sends one request to the private Modbus TCP server and returns
// its answer as an RTU frame without the CRC (unit ID, PDU). An error:
// the server closed the connection without answering (a fault, or a
// malformed request), or the simulator is closing.
func (r *rtuServer) forward(b net.Conn, txn uint16, unit uint8, pdu []byte) ([]byte, error) {
	req := make([]byte, 7, 7+len(pdu))
	binary.BigEndian.PutUint16(req[0:], txn)
	binary.BigEndian.PutUint16(req[4:], uint16(1+len(pdu)))
	req[6] = unit
	req = append(req, pdu...)
	b.SetWriteDeadline(time.Now().Add(rtuWriteTime))
	if _, err := b.Write(req); err != nil {
		return nil, fmt.Errorf("forward to the private Modbus TCP server: %w", err)
	}
	// No deadline on the answer: hang and hang_after_apply hold it until
	// they are cleared (or Close), as over Modbus TCP.
	var head [7]byte
	if _, err := io.ReadFull(b, head[:]); err != nil {
		return nil, fmt.Errorf("the private Modbus TCP server closed without an answer: %w", err)
	}
	n := int(binary.BigEndian.Uint16(head[4:]))
	if binary.BigEndian.Uint16(head[0:]) != txn || binary.BigEndian.Uint16(head[2:]) != 0 || n < 2 || n > 254 {
		return nil, fmt.Errorf("the private Modbus TCP server answered out of step: header % x", head)
	}
	answer := make([]byte, n, n+2)
	answer[0] = head[6]
	if _, err := io.ReadFull(b, answer[1:]); err != nil {
		return nil, fmt.Errorf("the private Modbus TCP server closed mid-answer: %w", err)
	}
	return answer, nil
}

// rtuServed reports whether the simulator serves function code fc (the
// library server's: read coils, discrete inputs, holding and input
// registers; write single and multiple coils and registers).
func rtuServed(fc byte) bool {
	switch fc {
	case 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x0f, 0x10:
		return true
	}
	return false
}

// readRTURequest reads one request frame (CRC included) into buf. It waits
// for a request as long as an idle connection is kept, then at most
// rtuFrameTime for the rest of it.
func readRTURequest(c net.Conn, buf []byte) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(modbusIdle))
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(rtuFrameTime))
	have, n := 2, 0
	switch buf[1] {
	case 0x01, 0x02, 0x03, 0x04, 0x05, 0x06:
		n = 8 // unit, function, address, quantity or value, CRC
	case 0x0f, 0x10:
		// unit, function, address, quantity, byte count, values, CRC
		if _, err := io.ReadFull(c, buf[2:7]); err != nil {
			return nil, fmt.Errorf("a request cut short: %w", err)
		}
		have, n = 7, 9+int(buf[6])
	default:
		return readQuiet(c, buf, 2)
	}
	if _, err := io.ReadFull(c, buf[have:n]); err != nil {
		return nil, fmt.Errorf("a request cut short: %w", err)
	}
	return buf[:n], nil
}

// readQuiet reads into buf after its first n bytes until the stream has
// been quiet for rtuQuiet, or buf is full.
func readQuiet(c net.Conn, buf []byte, n int) ([]byte, error) {
	for n < len(buf) {
		c.SetReadDeadline(time.Now().Add(rtuQuiet))
		m, err := c.Read(buf[n:])
		n += m
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return buf[:n], nil
}

// crc16 is CRC-16/MODBUS (polynomial 0xA001 reflected, initial 0xFFFF),
// sent low byte first. The library's is unexported; ten lines are not
// worth a dependency.
func crc16(b []byte) uint16 {
	crc := uint16(0xffff)
	for _, x := range b {
		crc ^= uint16(x)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xa001
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}
