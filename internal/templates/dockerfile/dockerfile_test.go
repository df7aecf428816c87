package dockerfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

func TestParse(t *testing.T) {
	df := `# a comment
ARG PY=3.12
FROM python:${PY}-slim AS app
ARG VERSION
ENV APP_HOME=/app PORT=8000
ENV LEGACY value with spaces
WORKDIR $APP_HOME
COPY --chown=app:app requirements.txt setup.py ./
ADD --chmod=755 run.sh /usr/local/bin/
RUN pip install -r requirements.txt \
    && echo done
RUN ["python", "-c", "print('hi there')"]
USER app:app
EXPOSE 8000
HEALTHCHECK CMD curl -f http://localhost:8000/ || exit 1
ENTRYPOINT ["python", "-m", "http.server"]
CMD ["8000"]
`
	got, err := Parse(df, map[string]string{"VERSION": "1.2", "UNDECLARED": "x"})
	if err != nil {
		t.Fatal(err)
	}
	if got.FromImage != "python:3.12-slim" {
		t.Errorf("FROM = %q", got.FromImage)
	}
	want := []Step{
		{"USER", []string{"root"}},
		{"WORKDIR", []string{"/"}},
		{"ENV", []string{"APP_HOME", "/app", "PORT", "8000"}},
		{"ENV", []string{"LEGACY", "value with spaces"}},
		{"WORKDIR", []string{"/app"}},
		{"COPY", []string{"requirements.txt", "./", "app:app", ""}},
		{"COPY", []string{"setup.py", "./", "app:app", ""}},
		{"COPY", []string{"run.sh", "/usr/local/bin/", "", "755"}},
		{"RUN", []string{"export PY=3.12 VERSION=1.2; pip install -r requirements.txt     && echo done"}},
		{"RUN", []string{"export PY=3.12 VERSION=1.2; python -c 'print('\\''hi there'\\'')'"}},
		{"USER", []string{"app"}},
	}
	if !reflect.DeepEqual(got.Steps, want) {
		t.Errorf("steps:\n got %q\nwant %q", got.Steps, want)
	}
	if got.StartCmd != "python -m http.server 8000" {
		t.Errorf("start = %q", got.StartCmd)
	}
	if got.ReadyCmd != "curl -f http://localhost:8000/ || exit 1" {
		t.Errorf("ready = %q", got.ReadyCmd)
	}
	if len(got.Warnings) < 2 { // EXPOSE, USER's group
		t.Errorf("warnings = %q", got.Warnings)
	}
}

func TestDefaults(t *testing.T) {
	got, err := Parse("FROM node:24\nCMD npm start", nil)
	if err != nil {
		t.Fatal(err)
	}
	n := len(got.Steps)
	if got.Steps[n-2].Type != "USER" || got.Steps[n-2].Args[0] != "user" || got.Steps[n-1].Args[0] != "/home/user" {
		t.Errorf("E2B's defaults not appended: %q", got.Steps)
	}
	if got.StartCmd != "npm start" {
		t.Errorf("shell-form CMD = %q", got.StartCmd)
	}
	got, _ = Parse("FROM x\nENTRYPOINT [\"/entry\"]\nCMD echo hi", nil)
	if got.StartCmd != "/entry /bin/sh -c 'echo hi'" {
		t.Errorf("exec ENTRYPOINT + shell CMD = %q", got.StartCmd)
	}
}

func TestRefusals(t *testing.T) {
	for name, df := range map[string]string{
		"no FROM":     "RUN ls",
		"before FROM": "RUN ls\nFROM x",
		"multi-stage": "FROM a AS b\nFROM c\nCOPY --from=b /x /x",
		"copy --from": "FROM a\nCOPY --from=b /x /x",
		"ADD URL":     "FROM a\nADD https://example.com/x /x",
		"escape":      "FROM a\nCOPY ../secret /x",
		"absolute":    "FROM a\nCOPY /etc/passwd /x",
		"scratch":     "FROM scratch",
		"RUN --mount": "FROM a\nRUN --mount=type=cache,target=/x ls",
		"unknown":     "FROM a\nFOO bar",
		"empty":       "",
		"bad var":     "FROM a\nWORKDIR ${x",
	} {
		_, err := Parse(df, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.UserMessage(err) == "" {
			t.Errorf("%s: %v, want an invalid-argument error", name, err)
		}
	}
	_, err := Parse("FROM a\nRUN ls\nFOO bar", nil)
	if !strings.Contains(errdefs.UserMessage(err), "line 3") {
		t.Errorf("error does not name the line: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("FROM a\nRUN ls\nCOPY a b\nCMD [\"x\"]")
	f.Add("ARG X=1\nFROM ${X}\nENV A=$X B=\"q\"\nHEALTHCHECK CMD true")
	f.Fuzz(func(t *testing.T, df string) {
		got, err := Parse(df, map[string]string{"X": "y"})
		if err != nil {
			if errdefs.UserMessage(err) == "" {
				t.Fatalf("error without a message: %v", err)
			}
			return
		}
		if got.FromImage == "" {
			t.Fatal("no base image and no error")
		}
		for _, st := range got.Steps {
			if st.Type == "COPY" && (strings.HasPrefix(st.Args[0], "/") || strings.Contains("/"+st.Args[0]+"/", "/../")) {
				t.Fatalf("COPY source escapes the context: %q", st.Args[0])
			}
		}
	})
}
