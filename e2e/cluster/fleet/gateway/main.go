// Command gateway stands in for the Envoy of a Gateway in the tests and benchmarks (no Envoy
// can be installed here): for each HTTP request it asks an endpoint picker over ext_proc, as
// Envoy's ext_proc filter does, which endpoint serves it, and forwards the request there.
//
// The picked endpoint is returned in the X-Kimik3-Endpoint response header. When the picker
// answers with an immediate response (no endpoint, a refused request), its status code and
// body are returned as they are; when the picker cannot be reached, 503.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	destinationHeader = "x-gateway-destination-endpoint"
	endpointHeader    = "X-Kimik3-Endpoint"
	maxBody           = 1 << 20
)

type gateway struct {
	picker  extproc.ExternalProcessorClient
	client  *http.Client
	timeout time.Duration
}

// picked is the picker's answer to one request's headers and body.
type picked struct {
	endpoint  string
	body      []byte
	immediate *extproc.ImmediateResponse
}

func header(key, value string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: key, RawValue: []byte(value)}
}

// pick runs the request phase of one ext_proc stream: headers, then the whole body.
func (g *gateway) pick(ctx context.Context, stream extproc.ExternalProcessor_ProcessClient,
	r *http.Request, body []byte) (*picked, error) {
	headers := []*corev3.HeaderValue{
		header(":method", r.Method), header(":path", r.URL.RequestURI()),
		header(":authority", r.Host), header(":scheme", "http"),
		header("content-length", strconv.Itoa(len(body))),
		header("x-request-id", uuid.NewString()),
	}
	for key, values := range r.Header {
		for _, value := range values {
			headers = append(headers, header(strings.ToLower(key), value))
		}
	}
	if err := stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extproc.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}},
	}}); err != nil {
		return nil, err
	}
	if err := stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestBody{
		RequestBody: &extproc.HttpBody{Body: body, EndOfStream: true},
	}}); err != nil {
		return nil, err
	}
	out := &picked{body: body}
	var mutated []byte
	seenHeaders := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		switch v := resp.Response.(type) {
		case *extproc.ProcessingResponse_ImmediateResponse:
			out.immediate = v.ImmediateResponse
			return out, nil
		case *extproc.ProcessingResponse_RequestHeaders:
			seenHeaders = true
			for _, option := range v.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if strings.EqualFold(option.GetHeader().GetKey(), destinationHeader) {
					value := option.GetHeader().GetRawValue()
					if len(value) == 0 {
						value = []byte(option.GetHeader().GetValue())
					}
					// The first of a comma-separated list is the pick; the rest are fallbacks.
					out.endpoint = strings.TrimSpace(strings.Split(string(value), ",")[0])
				}
			}
		case *extproc.ProcessingResponse_RequestBody:
			mutation := v.RequestBody.GetResponse().GetBodyMutation()
			if chunk := mutation.GetStreamedResponse(); chunk != nil {
				mutated = append(mutated, chunk.GetBody()...)
				if chunk.GetEndOfStream() {
					out.body = mutated
					return out, nil
				}
				continue
			}
			if replaced := mutation.GetBody(); replaced != nil {
				out.body = replaced
			}
			return out, nil
		}
		if seenHeaders && out.endpoint == "" {
			return nil, errors.New("the picker named no endpoint")
		}
	}
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), g.timeout)
	defer cancel()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	stream, err := g.picker.Process(ctx)
	if err != nil {
		http.Error(w, "endpoint picker unreachable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer func() { _ = stream.CloseSend() }()
	answer, err := g.pick(ctx, stream, r, body)
	if err != nil {
		http.Error(w, "endpoint picker: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if answer.immediate != nil {
		code := int(answer.immediate.GetStatus().GetCode())
		if code == 0 {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		_, _ = w.Write(answer.immediate.GetBody())
		return
	}
	upstream, err := http.NewRequestWithContext(ctx, r.Method,
		"http://"+answer.endpoint+r.URL.RequestURI(), bytes.NewReader(answer.body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	upstream.Header = r.Header.Clone()
	resp, err := g.client.Do(upstream)
	if err != nil {
		w.Header().Set(endpointHeader, answer.endpoint)
		http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	payload, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	// The response phase, as Envoy sends it, so the picker closes its books on the request.
	_ = stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extproc.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":status", strconv.Itoa(resp.StatusCode)),
			header("content-type", resp.Header.Get("Content-Type")),
		}}},
	}})
	_ = stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_ResponseBody{
		ResponseBody: &extproc.HttpBody{Body: payload, EndOfStream: true},
	}})
	for key, values := range resp.Header {
		for _, value := range values {
			w.Header().Add(key, value)
		}
	}
	w.Header().Set(endpointHeader, answer.endpoint)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(payload)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTP on")
	picker := flag.String("picker", "127.0.0.1:9002", "the endpoint picker's ext_proc gRPC address")
	timeout := flag.Duration("timeout", 60*time.Second, "per request, picking and serving")
	// The picker serves TLS with a certificate of its own making unless told otherwise;
	// gateways in front of it do not verify it either.
	useTLS := flag.Bool("tls", true, "speak TLS to the picker, without verifying its certificate")
	flag.Parse()
	creds := insecure.NewCredentials()
	if *useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // see above
	}
	conn, err := grpc.NewClient(*picker, grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatalf("endpoint picker %s: %v", *picker, err)
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The tests read the bound address from the first line.
	fmt.Println(listener.Addr().String())
	g := &gateway{
		picker: extproc.NewExternalProcessorClient(conn),
		// A connection per request, as the benchmark's direct requests make: a reused one
		// races the model server's close of an idle connection and fails the request.
		client:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		timeout: *timeout,
	}
	log.Fatal((&http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}).Serve(listener))
}
