package configs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// What the shipped files' comments cite exists: every "FILE.md §N" names
// a file of the repository with a section "## N.", so a reader of
// /etc/edge-agent/agent.yaml can follow it.
func TestCommentsCiteSectionsThatExist(t *testing.T) {
	files, err := filepath.Glob("*")
	if err != nil {
		t.Fatal(err)
	}
	cite := regexp.MustCompile(`([A-Za-z0-9_./-]+\.md) §(\d+)`)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cite.FindAllStringSubmatch(string(b), -1) {
			n++
			if !hasSection(filepath.Join("..", m[1]), m[2]) {
				t.Errorf("%s cites %q: no section %s in ../%s", f, m[0], m[2], m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no citation found: the pattern is wrong")
	}
}

func hasSection(path, n string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "## "+n+". ") {
			return true
		}
	}
	return false
}
